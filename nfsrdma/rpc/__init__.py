"""ONC RPC version 2 (RFC 5531): messages, authentication, calls in both directions."""
