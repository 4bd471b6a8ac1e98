"""Tools around the library: the ``replication`` CLI, the demo, chaos (kill tooling), the load
generator, the fault soak and the workload runner.

They sit above :mod:`replication` and :mod:`deploy` and use their public parts; neither imports
anything from here.
"""
