"""nfsrdma: an asyncio NFSv4.1 client and server over RPC-over-RDMA version 1 and TCP."""

__version__ = "0.1.0"
