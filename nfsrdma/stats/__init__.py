"""Statistics: per-operation counters and latency histograms (``core``, sans-IO, fed by the
COMPOUND loop and the client session), the server's figures gathered for a snapshot
(``collect``), the local admin socket (``admin``), Prometheus exposition (``metrics``) and the
``nfsrdma stats`` command (``cli``)."""
