"""``nfsrdma conform``: a protocol conformance harness for NFSv4.1 servers over TCP and
RPC-over-RDMA.

Checks are small async functions registered with ``@check`` in ``checks_<document>.py``; each
gets a ``Harness`` (``nfsrdma.conform.harness``) that gives it fresh connections, a raw COMPOUND
sender, sessions with slot/seqid control and a scratch directory, and reports its outcome by
returning (PASS) or raising ``Failed``, ``Unsupported`` or ``Skipped``
(``nfsrdma.conform.registry``). ``nfsrdma.conform.runner`` runs them and reports."""
