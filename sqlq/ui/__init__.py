"""The dashboard ``sqlq serve`` serves at ``/ui`` (``app``), its figures (``overview``,
``history``, ``charts``) and its sessions (``session``)."""
