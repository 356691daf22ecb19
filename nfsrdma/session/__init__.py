"""NFSv4.1 sessions: client ids, slots, sequence ids, reply cache, channels.

Server side (sans-IO): ``server.ServerSessions`` (what the COMPOUND layer uses), ``records``
(client and session records), ``registry`` (client records by owner: the EXCHANGE_ID case
table), ``slots`` (fore-channel slot table and reply cache), ``backchannel`` (the server's
CB_SEQUENCE slots), ``channels`` (CREATE_SESSION channel negotiation), ``ratelimit``.
Client side: the ``client*`` modules."""
