"""The flash tier's internals: a preallocated cache file on an SSD, written append-only.

``tier`` (``FlashTier``: wires the rest together), ``layout`` (byte offsets, 4 KiB aligned),
``cache_file`` (superblock, epoch, open rules), ``records`` (block headers, integrity),
``io_base`` / ``posix_io`` / ``kvikio_io`` (I/O backends), ``faults`` (fault injection for tests),
``staging`` (host staging sets, GPU work buffers, and their pools), ``pipeline`` (CPU and I/O stages on separate
threads), ``chunks`` (a chunk's stages), ``hostcopy`` (CPU KV caches: copies with in-cache
checksums), ``prefix_index`` (content hash -> record, and the log's space), ``prefix_store``
(the prefix jobs' bookkeeping), ``scan`` (the index rebuilt from the record headers at open).
Torch-free: ``layout``, ``records``, ``cache_file``, ``prefix_index``, ``scan``.
"""
