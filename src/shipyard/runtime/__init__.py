"""The ground floor: what every process of an instance shares, whatever starts it.

Death signals (``lifeline``), the failure file (``failure``) and how ``algo-k`` names
resolve (``resolver``). Imports nothing else of shipyard, so the agent and the runtime
libraries (ps, ddp, tf, mpi, horovod) can all stand on it.
"""
