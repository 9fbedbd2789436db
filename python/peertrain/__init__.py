"""peertrain for Python: gossip your own model over peertrain's peer runtime.

A BlueFog-shaped API (docs/python.md) over the engine's topology files, authenticated TCP
links, fault handling and link emulation. Works on NumPy arrays and anything with the
buffer protocol holding float32; peertrain.torch does the same for CPU torch tensors
without copying them, and gives DistributedOptimizer.

    import peertrain
    peertrain.init("ring8.yaml")            # the rank from RANK, SLURM_PROCID, ... when not given
    y = peertrain.neighbor_allreduce(x)     # Σ_j W_ij x_j

Every peer must make the same calls in the same order (as with MPI). Start the peers with
`peertrain launch --topology FILE -- python3 train.py`, srun or mpirun.
"""
import atexit
import os

from . import _peertrain as _core
from ._peertrain import Error, Handle, PeerLostError, TimeoutError  # noqa: F401

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "neighbors", "mixing_weights", "mixing_matrix", "spectral_gap",
    "lost_peers", "neighbor_allreduce", "neighbor_allreduce_nonblocking", "allreduce", "allreduce_nonblocking",
    "broadcast", "broadcast_nonblocking", "barrier", "consensus_distance", "Error", "PeerLostError",
    "TimeoutError", "Handle",
]

RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def _rank_from_environment():
    for name in RANK_VARIABLES:
        value = os.environ.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"peertrain.init(): ${name} is '{value}', not a rank") from None
    raise ValueError("peertrain.init(): no rank given and none of $" + ", $".join(RANK_VARIABLES) +
                     " is set (start the peers with `peertrain launch --topology FILE -- python3 ...`)")


def init(topology=None, rank=None, secret_file=None, peer_timeout=60.0, connect_timeout=60.0):
    """Joins the run: loads the topology file and connects to every other peer.

    topology defaults to $PEERTRAIN_TOPOLOGY (set by `peertrain launch`), rank to the first
    of $RANK, $SLURM_PROCID, $OMPI_COMM_WORLD_RANK, $PMI_RANK. With secret_file only peers
    holding the same key may join or send frames. Raises ValueError for a bad file or rank,
    peertrain.TimeoutError when the peers do not all come up within connect_timeout."""
    if topology is None:
        topology = os.environ.get("PEERTRAIN_TOPOLOGY")
        if not topology:
            raise ValueError("peertrain.init(): no topology given and $PEERTRAIN_TOPOLOGY is not set")
    if rank is None:
        rank = _rank_from_environment()
    if secret_file is None:
        secret_file = os.environ.get("PEERTRAIN_SECRET_FILE", "")
    _core.init(os.fspath(topology), int(rank), os.fspath(secret_file), float(peer_timeout), float(connect_timeout))
    atexit.register(shutdown)


shutdown = _core.shutdown
is_initialized = _core.is_initialized
rank = _core.rank
size = _core.size
neighbors = _core.neighbors
spectral_gap = _core.spectral_gap
barrier = _core.barrier
consensus_distance = _core.consensus_distance


def mixing_matrix():
    """W as a dense n×n NumPy array of float64 (W at step 0 for a time-varying topology)."""
    return _core.mixing_matrix()


def mixing_weights():
    """(self_weight, {neighbour: weight}): this peer's row of W."""
    return _core.mixing_weights()


def lost_peers():
    """[(peer, reason)] for every neighbour this peer dropped (it goes on without them)."""
    return _core.lost_peers()


def neighbor_allreduce(tensor, self_weight=None, src_weights=None):
    """Σ_j W_ij x_j over this peer and its neighbours, as a new array. self_weight and
    src_weights ({neighbour: weight}) replace W's row; src_weights must name neighbours."""
    return _core.neighbor_allreduce(tensor, self_weight, src_weights)


def neighbor_allreduce_nonblocking(tensor, self_weight=None, src_weights=None):
    """neighbor_allreduce started in the background: returns a Handle; handle.wait(timeout)
    gives the result. The handle holds the tensor's buffer until then: resizing it (an
    array.array, a NumPy array) raises BufferError, and its values must not change."""
    return _core.neighbor_allreduce_nonblocking(tensor, self_weight, src_weights)


def allreduce(tensor, average=True):
    """The sum (or, with average, the mean) over every peer, as a new array."""
    return _core.allreduce(tensor, average)


def allreduce_nonblocking(tensor, average=True):
    return _core.allreduce_nonblocking(tensor, average)


def broadcast(tensor, root):
    """root's tensor on every peer, as a new array."""
    return _core.broadcast(tensor, root)


def broadcast_nonblocking(tensor, root):
    return _core.broadcast_nonblocking(tensor, root)
