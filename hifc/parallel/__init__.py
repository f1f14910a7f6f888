"""Several engines, or several GPUs for one engine.

``config``: ``ParallelConfig`` (torch-free; nested in ``EngineConfig``) and the per-replica
configs made from it. ``data_parallel``: ``DataParallelEngine``, N engine replicas in processes
of their own behind the ``LLMEngine`` interface, and ``build_engine``, which picks it or a plain
``LLMEngine``. The replicas' flash files on one device share it through
:mod:`hifc.tiers.flash.arbiter`. ``tensor_parallel``: one engine's model split over several
processes (``tp_launch``: ranks and their devices and files; ``tp_driver``: rank 0's side;
``tp_worker``: the others; ``tp_control``: the messages between them).
"""
