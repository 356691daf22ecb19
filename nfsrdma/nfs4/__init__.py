"""NFSv4.1 server: COMPOUND processing, operations (one module per family), attributes, state."""
