"""Instance sandboxes: each instance in its own Linux namespaces, like a container.

* mount namespace: the instance's tree bind-mounted at ``/opt/ml`` (SM_* values equal
  SageMaker's byte for byte) and a job ``/etc/hosts`` that resolves ``algo-1..N`` for libc;
* UTS namespace: hostname ``algo-k``;
* network namespace: the instance owns an address on the job's private network (a veth
  pair to a bridge inside the job's own network namespace) and the whole port space;
  nothing a job listens on is reachable from the host. Outbound traffic goes through
  pasta (``passt``), unless the job asked for network isolation.

Rootless where the kernel allows (a user namespace per job); as root none is needed.
Every namespace, mount, veth and bridge belongs to a process of the job: when the job's
processes are gone, the kernel removes them all, whatever killed the job.

Stdlib only, below the agent and the backends (``probe`` is read by the control plane).
"""
