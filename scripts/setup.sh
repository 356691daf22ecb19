#!/usr/bin/env bash
# Idempotent set-up on Debian 12: apt packages (when root), a venv at .venv made from
# Debian's python3 with system site-packages (so python3-pyverbs imports), pip installs.
# Usage: scripts/setup.sh serve|test
set -euo pipefail
profile=${1:-test}
cd "$(dirname "$0")/.."

serve_pkgs=(python3 python3-venv python3-pip python3-pyverbs rdma-core ibverbs-providers librdmacm1
  python3-gssapi)
serve_pkgs+=(build-essential python3-dev)  # a C compiler and headers: the compiled build (setup.py)
test_pkgs=("${serve_pkgs[@]}" qemu-system-x86 linux-image-amd64 ibverbs-utils rdmacm-utils
  perftest nfs-kernel-server nfs-common iproute2 busybox-static kmod udev
  nfs-ganesha nfs-ganesha-mem nfs-ganesha-vfs
  krb5-kdc krb5-admin-server krb5-user libkrb5-dev
  ceph-mon ceph-mgr ceph-osd ceph-mds ceph-common libcephfs2 python3-cephfs python3-rados
  attr  # setfattr/getfattr: the NFSv4.2 extended-attribute test bed checks
  tshark)  # nfsrdma conform --trace: the pcap is decoded in tests
test_pkgs+=(systemd)  # systemd-analyze verifies contrib/nfsrdma.service
test_pkgs+=(libibverbs-dev)  # <infiniband/verbs.h>: the struct probe of tests/unit/rdma/test_verbs_direct.py
case "$profile" in
  serve) pkgs=("${serve_pkgs[@]}"); extras="fast,metrics" ;;
  test) pkgs=("${test_pkgs[@]}"); extras="dev,testbed" ;;
  *) echo "usage: $0 serve|test" >&2; exit 2 ;;
esac

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]]; then
    echo "setup: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "setup: missing Debian packages (run as root, or: sudo apt-get install ${missing[*]})" >&2
  fi
fi

if [[ ! -x .venv/bin/python ]]; then
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
stamp=".venv/.nfsrdma-$profile-$(sha256sum pyproject.toml | cut -c1-16)"
if [[ ! -e $stamp ]]; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  # Nothing compiled here: an editable install would compile in a build directory of its own,
  # every time; make serve and make test build the hot path in place instead (setup.py
  # build_ext --inplace, incremental), with the mypy the extras install.
  NFSRDMA_COMPILE=none .venv/bin/python -m pip install -q -e ".[$extras]"
  touch "$stamp"
fi
