"""The ground floor: what every process of an instance shares, whatever starts it.

Death signals (``lifeline``), the failure file (``failure``), how ``algo-k`` names
resolve (``resolver``), and how host code opens a job's tree without following the job's
links (``safepath``). Imports nothing else of shipyard, so the agent and the runtime
libraries (ps, ddp, tf, mpi, horovod) can all stand on it.
"""
