"""Script fragments the listener tests put at the top of their jobs' entry points (local
sandbox and Ray): each holds the script until its distribution's servers are up, so the
test reads their listeners while they are there."""

# the chief's script starts while the TF servers are still importing TensorFlow: wait
# until every ps and worker task of TF_CONFIG answers (the chief is the script itself)
TF_PRELUDE = r"""
import json
cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
for address in cluster["ps"] + cluster.get("worker", []):
    host, port = address.rsplit(":", 1)
    deadline = time.time() + 150
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
"""
# every rank is up once the world's first barrier returns
MPI_PRELUDE = "from mpi4py import MPI\nMPI.COMM_WORLD.Barrier()\n"
