"""The engine-neutral runtime: the service HTTP calls, the scheduler and its lanes,
the worker pool and its health loop, and the job kinds."""
