"""The storage engines that the product wires in, and the registry that names them.

``registry`` is the one place that imports an engine: memory (``common.engine``),
walq (the top-level ``walq`` folder, installed as ``sqlq.walq``), ``sqlite`` and
``postgres``. ``rows`` and ``listing`` are what the two SQL engines share.
"""
