"""Exports with client rules: the exports(5) file format, and which rule a client gets.

A file holds one export a line::

    # comment
    /srv/data   192.0.2.0/24(rw,no_root_squash)  *(ro)
    /srv/home   localhost(rw,sec=krb5p:sys) \\
                2001:db8::/32(ro,insecure)

``PATH CLIENT(options) CLIENT(options)...``: ``PATH`` is absolute (double quotes, or ``\\040``
octal escapes, for odd characters); a backslash at the end of a line continues it. A client is
``*`` (everybody), an IPv4 or IPv6 address, a CIDR network (``10.0.0.0/8``, ``fd00::/8``, or a
netmask ``10.0.0.0/255.0.0.0``), or a host name (resolved when the file is loaded; every address
it resolves to matches). ``CLIENT`` alone takes the default options.

Options (defaults as exports(5): ``ro,root_squash,secure,sec=sys``): ``rw``/``ro``,
``root_squash``/``no_root_squash``/``all_squash``, ``anonuid=N``/``anongid=N``,
``sec=F:F...`` (flavours ``sys``, ``none``, ``krb5``, ``krb5i``, ``krb5p``, in the order SECINFO
offers them), ``fsid=N`` (a number from 1 to 2³²-1; the default is derived from the path),
``secure`` (the client's source port must be below 1024) / ``insecure``. ``sync``, ``async``,
``wdelay``, ``no_wdelay``, ``subtree_check`` and ``no_subtree_check`` are accepted and change
nothing. ``fsid=`` is per export: every client rule of a line that names one must name the same.

Matching: the rules of an export are tried in the order they are written and the **first** whose
client matches the source address applies; a client no rule matches has no access to the export.

Sans-IO except :func:`load`, which reads the file and resolves host names.
"""

from __future__ import annotations

import enum
import hashlib
import ipaddress
import os
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from nfsrdma.vfs.base import Cred

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str], Sequence[str]]
"""Host name → its addresses (text); raises OSError when the name does not resolve."""

AUTH_NONE: Final = 0
AUTH_SYS: Final = 1
RPCSEC_GSS_KRB5: Final = 390003
RPCSEC_GSS_KRB5I: Final = 390004
RPCSEC_GSS_KRB5P: Final = 390005
# RFC 2623 pseudo-flavours by exports(5) name.
FLAVORS: Final[dict[str, int]] = {
    "sys": AUTH_SYS,
    "none": AUTH_NONE,
    "krb5": RPCSEC_GSS_KRB5,
    "krb5i": RPCSEC_GSS_KRB5I,
    "krb5p": RPCSEC_GSS_KRB5P,
}
PRIVILEGED_PORT_LIMIT: Final = 1024
_NO_EFFECT: Final = frozenset(
    {"sync", "async", "wdelay", "no_wdelay", "subtree_check", "no_subtree_check"}
)


class ExportsError(ValueError):
    """A line of an exports file that cannot be used: ``file:line: message``."""

    def __init__(self, file: str, line: int, message: str) -> None:
        super().__init__(f"{file}:{line}: {message}")
        self.file = file
        self.line = line
        self.message = message


class Squash(enum.Enum):
    ROOT = "root_squash"
    NONE = "no_root_squash"
    ALL = "all_squash"


@dataclass(frozen=True, slots=True)
class Options:
    """What one client rule grants."""

    read_only: bool = True
    squash: Squash = Squash.ROOT
    anon_uid: int = 65534
    anon_gid: int = 65534
    flavors: tuple[int, ...] = (AUTH_SYS,)  # pseudo-flavours, in the order given
    secure: bool = True

    def identity(self, cred: Cred, flavor: int) -> Cred:
        """The file-system identity of a caller (AUTH_NONE: the anonymous one)."""
        if flavor == AUTH_NONE or self.squash is Squash.ALL:
            return Cred(self.anon_uid, self.anon_gid, ())
        if self.squash is Squash.NONE or (cred.uid and cred.gid and 0 not in cred.gids):
            return Cred(cred.uid, cred.gid, cred.gids)
        return Cred(
            self.anon_uid if cred.uid == 0 else cred.uid,
            self.anon_gid if cred.gid == 0 else cred.gid,
            tuple(self.anon_gid if g == 0 else g for g in cred.gids),
        )


@dataclass(frozen=True, slots=True)
class ClientMatch:
    """Who a rule is for: everybody, or any of some networks (one address is a /32 or /128)."""

    text: str
    networks: tuple[IpNetwork, ...] = ()  # empty: everybody

    def matches(self, address: IpAddress) -> bool:
        if not self.networks:
            return True
        return any(address.version == n.version and address in n for n in self.networks)


@dataclass(frozen=True, slots=True)
class ClientRule:
    client: ClientMatch
    options: Options
    line: int = 0


@dataclass(frozen=True, slots=True)
class ExportEntry:
    """One exported directory: its path (as written, normalised), fsid and client rules."""

    path: str
    fsid: int
    rules: tuple[ClientRule, ...]

    def rule_for(self, address: IpAddress) -> ClientRule | None:
        """The first rule whose client matches ``address`` (None: no access)."""
        for rule in self.rules:
            if rule.client.matches(address):
                return rule
        return None


@dataclass(frozen=True, slots=True)
class ExportTable:
    entries: tuple[ExportEntry, ...]

    def by_path(self) -> dict[str, ExportEntry]:
        return {e.path: e for e in self.entries}


def client_address(peer: str) -> tuple[IpAddress | None, int]:
    """The address and port of a connection's peer as transports write it ("192.0.2.1:700",
    "[::1]:700", "::1:700": the port always follows); an IPv4-mapped IPv6 address counts as
    its IPv4 address. (None, 0) when it is no address."""
    host, port = peer, ""
    if peer.startswith("["):
        host, _, rest = peer[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        head, sep, tail = peer.rpartition(":")
        if sep and tail.isdigit() and _is_ip(head):
            host, port = head, tail
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None, 0
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address, int(port) if port.isdigit() else 0


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def default_fsid(path: str) -> int:
    """A stable fsid for an export that names none: 31 bits of a hash of its path, never 0."""
    h = int.from_bytes(hashlib.sha256(path.encode("utf-8", "surrogateescape")).digest()[:4], "big")
    return (h & 0x7FFFFFFF) or 1


def resolve_host(name: str) -> Sequence[str]:
    infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    return sorted({str(info[4][0]) for info in infos})


# -- parsing ----------------------------------------------------------------------------------


def _logical_lines(text: str) -> Iterable[tuple[int, str]]:
    """(first line number, text) of each line: comments dropped, continuations joined."""
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        yield start, " ".join(pending)
        pending = []
    if pending:
        yield start, " ".join(pending)


def _unescape(word: str) -> str:
    """exports(5) quoting: double quotes around the path, ``\\ooo`` octal escapes."""
    if len(word) >= 2 and word[0] == word[-1] == '"':
        word = word[1:-1]
    out: list[str] = []
    i = 0
    while i < len(word):
        c = word[i]
        if c == "\\" and len(word[i + 1 : i + 4]) == 3 and word[i + 1 : i + 4].isdigit():
            out.append(chr(int(word[i + 1 : i + 4], 8)))
            i += 4
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _split(line: str) -> list[str]:
    """Split on blanks, keeping a double-quoted path whole."""
    words: list[str] = []
    i, n = 0, len(line)
    while i < n:
        if line[i].isspace():
            i += 1
            continue
        j = i
        if line[i] == '"':
            j = line.find('"', i + 1)
            j = n if j < 0 else j + 1
        while j < n and not line[j].isspace():
            j += 1
        words.append(line[i:j])
        i = j
    return words


class _LineParser:
    def __init__(self, file: str, line: int, resolve: Resolver) -> None:
        self.file = file
        self.line = line
        self.resolve = resolve

    def error(self, message: str) -> ExportsError:
        return ExportsError(self.file, self.line, message)

    def client(self, text: str) -> ClientMatch:
        if text == "*":
            return ClientMatch(text)
        if text.startswith("@"):
            raise self.error(f"client {text!r}: netgroups are not supported")
        if any(c in text for c in "*?["):
            raise self.error(f"client {text!r}: wildcard host names are not supported")
        if "/" in text:
            try:
                return ClientMatch(text, (ipaddress.ip_network(text, strict=False),))
            except ValueError:
                raise self.error(f"client {text!r}: not a network") from None
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            pass
        else:
            return ClientMatch(text, (ipaddress.ip_network(address),))
        if not text or text.startswith("-"):
            raise self.error(f"client {text!r}: not a host, address or network")
        try:
            addresses = self.resolve(text)
        except OSError as e:
            raise self.error(f"client {text!r}: host name does not resolve ({e})") from None
        networks: list[IpNetwork] = []
        for a in addresses:
            ip = ipaddress.ip_address(a.split("%", 1)[0])
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            networks.append(ipaddress.ip_network(ip))
        if not networks:
            raise self.error(f"client {text!r}: host name has no address")
        return ClientMatch(text, tuple(networks))

    def number(self, option: str, value: str, low: int, high: int) -> int:
        if not value.isdigit() or not low <= int(value) <= high:
            raise self.error(f"option {option!r}: a number from {low} to {high} is needed")
        return int(value)

    def options(self, text: str) -> tuple[Options, int | None]:
        read_only, squash, secure = True, Squash.ROOT, True
        anon_uid = anon_gid = 65534
        flavors: tuple[int, ...] = (AUTH_SYS,)
        fsid: int | None = None
        for option in text.split(","):
            option = option.strip()
            name, eq, value = option.partition("=")
            if option in ("rw", "ro"):
                read_only = option == "ro"
            elif option in ("root_squash", "no_root_squash", "all_squash"):
                squash = Squash(option)
            elif option == "no_all_squash":
                squash = Squash.ROOT
            elif option in ("secure", "insecure"):
                secure = option == "secure"
            elif option in _NO_EFFECT:
                pass
            elif eq and name == "anonuid":
                anon_uid = self.number(option, value, 0, 0xFFFFFFFF)
            elif eq and name == "anongid":
                anon_gid = self.number(option, value, 0, 0xFFFFFFFF)
            elif eq and name == "fsid":
                if value in ("0", "root"):
                    raise self.error(
                        f"option {option!r}: the pseudo-root is built from the export paths; "
                        "an export cannot be it"
                    )
                fsid = self.number(option, value, 1, 0xFFFFFFFF)
            elif eq and name == "sec":
                names = value.split(":")
                unknown = [f for f in names if f not in FLAVORS]
                if not value or unknown:
                    raise self.error(
                        f"option {option!r}: unknown security flavour "
                        f"{(unknown or [''])[0]!r} (known: {', '.join(FLAVORS)})"
                    )
                flavors = tuple(dict.fromkeys(FLAVORS[f] for f in names))
            else:
                raise self.error(f"unknown option {option!r}")
        return Options(read_only, squash, anon_uid, anon_gid, flavors, secure), fsid

    def rule(self, word: str) -> tuple[ClientRule, int | None]:
        if word.startswith("("):
            raise self.error(
                f"options {word!r} without a client (a blank before '('? write *{word} for "
                "everybody)"
            )
        client, paren, rest = word.partition("(")
        if paren:
            if not rest.endswith(")") or ")" in rest[:-1]:
                raise self.error(f"client {word!r}: options must end with ')'")
            options, fsid = self.options(rest[:-1])
        else:
            options, fsid = Options(), None
        return ClientRule(self.client(client), options, self.line), fsid


def parse(text: str, file: str = "<exports>", resolve: Resolver = resolve_host) -> ExportTable:
    """Parse an exports file; raises :class:`ExportsError` at the first bad line."""
    entries: list[ExportEntry] = []
    paths: dict[str, int] = {}
    fsids: dict[int, str] = {}
    for number, line in _logical_lines(text):
        words = _split(line)
        if not words:
            continue
        p = _LineParser(file, number, resolve)
        path = _unescape(words[0])
        if not path.startswith("/"):
            raise p.error(f"export path {words[0]!r} is not absolute")
        path = os.path.normpath(path)
        if path.startswith("//"):
            path = path[1:]
        if path == "/":
            raise p.error("'/' cannot be exported: it is the pseudo-root")
        if path in paths:
            raise p.error(f"{path} is exported already (line {paths[path]})")
        for other in paths:
            if path.startswith(other + "/") or other.startswith(path + "/"):
                raise p.error(f"{path} and {other} (line {paths[other]}) are nested exports")
        if len(words) == 1:
            raise p.error(f"{path}: no client (write '*' for everybody)")
        rules: list[ClientRule] = []
        fsid: int | None = None
        for word in words[1:]:
            rule, rule_fsid = p.rule(word)
            if rule_fsid is not None:
                if fsid is not None and rule_fsid != fsid:
                    raise p.error(f"{path}: two different fsid= values")
                fsid = rule_fsid
            rules.append(rule)
        fsid = default_fsid(path) if fsid is None else fsid
        if fsid in fsids:
            raise p.error(f"fsid {fsid} of {path} is the fsid of {fsids[fsid]} already")
        paths[path] = number
        fsids[fsid] = path
        entries.append(ExportEntry(path, fsid, tuple(rules)))
    return ExportTable(tuple(entries))


def load(file: str, resolve: Resolver = resolve_host) -> ExportTable:
    """Read and parse an exports file (OSError when it cannot be read)."""
    with open(file, encoding="utf-8", errors="surrogateescape") as f:
        return parse(f.read(), file, resolve)


def check_paths(table: ExportTable, file: str = "<exports>") -> None:
    """Every export path must be a directory now (ExportsError naming the line otherwise)."""
    for entry in table.entries:
        if not os.path.isdir(entry.path):
            line = entry.rules[0].line if entry.rules else 0
            raise ExportsError(file, line, f"{entry.path} is not a directory")
