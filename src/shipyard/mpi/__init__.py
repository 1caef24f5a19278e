"""The mpi distribution's runtime: finding and invoking mpirun (``command``), the
launcher wrapper (``launch``), the per-rank wrapper that records a rank's failure
(``rank``) and the launch server used over Ray (``rsh``). The runner's plan, which turns
(hosts, current host, options) into processes, is ``shipyard.agent.runners.mpi``.
"""
