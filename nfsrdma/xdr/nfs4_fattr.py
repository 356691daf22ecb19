"""The NFSv4.1 attribute table compiled with ``nfs4.x`` (see ``fattrgen.py``).

What this server returns (RFC 8881 section 5.6 REQUIRED, 5.7 RECOMMENDED): exactly what
GETATTR can return correctly — the REQUIRED attributes, the RECOMMENDED ones the Linux client
asks for, and nothing about ACLs, named attributes, fs_locations or pNFS. Each readable one has
its value source, an expression over ``a`` (the object's ``Attributes``), ``fs`` (``FsStats``),
``fh``, ``cfg`` (the server's limits: ``lease_time``, ``max_io``) and ``err`` (rdattr_error).
Owners are numeric strings ("1000"), as knfsd sends them to AUTH_SYS clients.

The masks are those the Linux NFSv4.1 client (fs/nfs/nfs4proc.c) and our own client send most,
intersected with what is supported; each gets its own specialised codec. The layers group the
attributes the Linux client combines, so that any of its masks is encoded in two calls; any
other mask is coded group by group over the generated tables.
"""

from __future__ import annotations

from nfsrdma.xdr.fattrgen import FattrTable

_NS = 1_000_000_000
MAX_FILESIZE = (1 << 63) - 1
_U32_MAX = 0xFFFFFFFF

SUPPORTED = (
    "supported_attrs",
    "type",
    "fh_expire_type",
    "change",
    "size",
    "link_support",
    "symlink_support",
    "named_attr",
    "fsid",
    "unique_handles",
    "lease_time",
    "rdattr_error",
    "filehandle",
    "suppattr_exclcreat",
    "aclsupport",
    "cansettime",
    "case_insensitive",
    "case_preserving",
    "chown_restricted",
    "fileid",
    "files_avail",
    "files_free",
    "files_total",
    "homogeneous",
    "maxfilesize",
    "maxlink",
    "maxname",
    "maxread",
    "maxwrite",
    "mode",
    "no_trunc",
    "numlinks",
    "owner",
    "owner_group",
    "rawdev",
    "space_avail",
    "space_free",
    "space_total",
    "space_used",
    "time_access",
    "time_access_set",
    "time_delta",
    "time_metadata",
    "time_modify",
    "time_modify_set",
    "mounted_on_fileid",
    # NFSv4.2 (RFC 7862 section 12.2, RFC 8276 section 8.3): left out of supported_attrs and
    # of every reply for minor version 1 (nfsrdma.nfs4.attrs.for_minor_version).
    "clone_blksize",
    "space_freed",
    "change_attr_type",
    "xattr_support",
)
# Exclusive create stores its verifier in atime/mtime, so the time setters are left out
# (RFC 8881 section 18.16.3, and the VFS contract).
SUPPATTR_EXCLCREAT = ("size", "mode", "owner", "owner_group")

FIXED = {
    "type": "a.type",
    "fh_expire_type": "FH4_PERSISTENT",
    "change": "a.change",
    "size": "a.size",
    "link_support": "1",
    "symlink_support": "1",
    "named_attr": "0",
    "fsid": "*a.fsid #2",
    "unique_handles": "1",
    "lease_time": "cfg.lease_time",
    "rdattr_error": "err",
    "aclsupport": "0",
    "cansettime": "1",
    "case_insensitive": "0",
    "case_preserving": "1",
    "chown_restricted": "1",
    "fileid": "a.fileid",
    "files_avail": "fs.files_avail",
    "files_free": "fs.files_free",
    "files_total": "fs.files_total",
    "homogeneous": "1",
    "maxfilesize": str(MAX_FILESIZE),
    "maxlink": f"min(fs.max_link, {_U32_MAX})",
    "maxname": f"min(fs.max_name, {_U32_MAX})",
    "maxread": "cfg.max_io",
    "maxwrite": "cfg.max_io",
    "mode": "a.mode",
    "no_trunc": "1",
    "numlinks": "a.nlink",  # i_nlink is 32 bits in Linux
    "rawdev": "*a.rdev #2",
    "space_avail": "fs.bytes_avail",
    "space_free": "fs.bytes_free",
    "space_total": "fs.bytes_total",
    "space_used": "a.space_used",
    "time_access": f"*divmod(a.atime_ns, {_NS}) #2",
    "time_delta": "0, 1",
    "time_metadata": f"*divmod(a.ctime_ns, {_NS}) #2",
    "time_modify": f"*divmod(a.mtime_ns, {_NS}) #2",
    "mounted_on_fileid": "a.mounted_on_fileid",
    # CLONE's alignment: the block size of the file systems FICLONERANGE works on (xfs, btrfs).
    "clone_blksize": "4096",
    # What removing the object would free: its blocks, when this is its last link.
    "space_freed": "a.space_used if a.nlink <= 1 else 0",
    # ctime plus a per-server counter (vfs/changes.py): none of the RFC's exact kinds.
    "change_attr_type": "NFS4_CHANGE_TYPE_IS_UNDEFINED",
    "xattr_support": "fs.user_xattrs",
}
VARIABLE = {
    "filehandle": "_fattr4_opaque(fh)",
    "owner": "_fattr4_decimal(a.uid)",
    "owner_group": "_fattr4_decimal(a.gid)",
}

_LINUX_FATTR = (  # nfs4_fattr_bitmap, what Linux asks after OPEN, WRITE, SETATTR, LOOKUP...
    "type",
    "change",
    "size",
    "fsid",
    "fileid",
    "mode",
    "numlinks",
    "owner",
    "owner_group",
    "rawdev",
    "space_used",
    "time_access",
    "time_metadata",
    "time_modify",
    "mounted_on_fileid",
)
MASKS = {
    "linux_fattr": _LINUX_FATTR,
    "linux_readdir_plus": ("rdattr_error", "filehandle", *_LINUX_FATTR),
    "linux_readdir": ("rdattr_error", "mounted_on_fileid"),
    "linux_cache_consistency": ("change", "size", "time_metadata", "time_modify"),
    "linux_open_noattr": ("type", "fileid"),
    "linux_statfs": (
        "files_avail",
        "files_free",
        "files_total",
        "space_avail",
        "space_free",
        "space_total",
    ),
    "linux_pathconf": ("maxlink", "maxname"),
    "linux_fsinfo": ("maxfilesize", "maxread", "maxwrite", "lease_time", "time_delta"),
    "linux_server_caps": (
        "supported_attrs",
        "fh_expire_type",
        "link_support",
        "symlink_support",
        "aclsupport",
        "case_insensitive",
        "case_preserving",
        "suppattr_exclcreat",
    ),
    "client_stat": _LINUX_FATTR[:-1],  # nfsrdma.client.attrs.STAT_ATTRS
    "rdattr_error": ("rdattr_error",),
    # What SETATTR and OPEN's createattrs carry: chmod, truncate, chown, utimes.
    "set_mode": ("mode",),
    "set_size": ("size",),
    "set_owners": ("owner", "owner_group"),
    "set_times": ("time_access_set", "time_modify_set"),
}

# The Linux client adds and removes attributes of nfs4_fattr_bitmap as its caches need them
# (nfs4_bitmask_set, nfs4_bitmap_copy_adjust), and READDIR adds rdattr_error and filehandle:
# every such mask is coded in at most two calls.
LAYERS = (
    (
        ("type", "change", "size", "fsid", "rdattr_error", "filehandle", "fileid", "mode"),
        (
            "numlinks",
            "owner",
            "owner_group",
            "rawdev",
            "space_used",
            "time_access",
            "time_metadata",
            "time_modify",
            "mounted_on_fileid",
        ),
    ),
)

TABLE = FattrTable(
    fixed=FIXED,
    variable=VARIABLE,
    bitmaps={"supported_attrs": SUPPORTED, "suppattr_exclcreat": SUPPATTR_EXCLCREAT},
    masks=MASKS,
    layers=LAYERS,
)
