"""The 3FS protocol shared by the storage and meta services and the ``hf3fs`` client, as domain types.

``datapath`` (the bulk data path's wire format and its client), ``shm`` (same-host shared memory),
``capability`` (meta's IO capabilities), ``checksum`` (CRC-32C), ``layout`` (which chain holds a chunk),
``routing`` (chains, targets and nodes from mgmtd) and ``transport`` (how a write's bytes travel).
"""
