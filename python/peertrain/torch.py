"""peertrain for PyTorch: the collectives on CPU float32 tensors (read in place through
.numpy(), never copied in), broadcast_parameters, and DistributedOptimizer, which couples a
model's replicas every step:

    opt = peertrain.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model)
    loss.backward(); opt.step()

algorithm="dpsgd" (D-PSGD, Lian et al. 2017): x_{k+1} = Σ_j W_ij x_j(k) − the optimizer's
step at x_k's gradient. The neighbour exchange of each parameter starts from a hook as soon
as backward reaches it (x_k is only read during backward), so it overlaps the rest of the
backward pass; step() waits for it, writes the mix into the parameter, and lets the
optimizer step. The same iterates as the explicit loop
    loss.backward(); p.data = neighbor_allreduce(p.data) for each p; optimizer.step().
algorithm="allreduce": the gradients are averaged over every peer before the step (C-PSGD).

DiLoCo (Douillard et al. 2023) wraps the user's own optimizer as the inner one:

    opt = peertrain.torch.DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=1e-3), inner_steps=50)
    loss.backward(); opt.step()

Every inner_steps steps the pseudo-gradients Δ = θ_outer − θ are averaged (exchange=
"allreduce" over every peer, or "gossip": one round with the topology's W) and an outer
torch.optim.SGD (Nesterov, lr 0.7, momentum 0.9 by default) applies the average to θ_outer,
which every parameter then takes.
"""
import numpy as _np
import torch

import peertrain as _pt

__all__ = ["neighbor_allreduce", "neighbor_allreduce_nonblocking", "allreduce", "allreduce_nonblocking", "broadcast",
           "consensus_distance", "broadcast_parameters", "DistributedOptimizer", "DiLoCo"]


def _view(tensor, call):
    """tensor's memory as a float32 NumPy array (no copy for a contiguous CPU tensor)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"peertrain.torch.{call}(): expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"peertrain.torch.{call}(): peertrain works on CPU tensors, got one on {tensor.device}")
    if tensor.dtype != torch.float32:
        raise TypeError(f"peertrain.torch.{call}(): peertrain supports float32 tensors; got {tensor.dtype} "
                        "(convert with .float())")
    return tensor.detach().contiguous().numpy()


def _tensor(array, like):
    return torch.from_numpy(_np.asarray(array)).view(like.shape)


class Handle:
    """A non-blocking call on tensors: wait(timeout=None) returns the result tensor."""

    def __init__(self, handle, like):
        self._handle, self._like = handle, like

    def wait(self, timeout=None):
        return _tensor(self._handle.wait(timeout), self._like)

    def done(self):
        return self._handle.done()


def neighbor_allreduce(tensor, self_weight=None, src_weights=None):
    return _tensor(_pt.neighbor_allreduce(_view(tensor, "neighbor_allreduce"), self_weight, src_weights), tensor)


def neighbor_allreduce_nonblocking(tensor, self_weight=None, src_weights=None):
    view = _view(tensor, "neighbor_allreduce_nonblocking")
    return Handle(_pt.neighbor_allreduce_nonblocking(view, self_weight, src_weights), tensor)


def allreduce(tensor, average=True):
    return _tensor(_pt.allreduce(_view(tensor, "allreduce"), average), tensor)


def allreduce_nonblocking(tensor, average=True):
    return Handle(_pt.allreduce_nonblocking(_view(tensor, "allreduce_nonblocking"), average), tensor)


def broadcast(tensor, root):
    return _tensor(_pt.broadcast(_view(tensor, "broadcast"), root), tensor)


def consensus_distance(tensor):
    return _pt.consensus_distance(_view(tensor, "consensus_distance"))


def broadcast_parameters(params, root=0):
    """Overwrites, in place, every tensor of a state_dict (or of (name, tensor) pairs) with
    root's: the replicas start equal. Non-float tensors (counters) travel as float32."""
    items = params.items() if hasattr(params, "items") else params
    with torch.no_grad():
        for _, p in items:
            if p.dtype == torch.float32:
                p.copy_(broadcast(p, root))
            else:
                p.copy_(broadcast(p.to(torch.float32), root).to(p.dtype))


class DistributedOptimizer:
    """Wraps a torch optimizer so that each step() couples this peer's model with the others
    (see the module's text). Everything else is the wrapped optimizer's."""

    ALGORITHMS = ("dpsgd", "allreduce")

    def __init__(self, optimizer, model, algorithm="dpsgd"):
        if algorithm not in self.ALGORITHMS:
            raise ValueError(f"DistributedOptimizer: algorithm '{algorithm}' is not one of {', '.join(self.ALGORITHMS)}")
        if not _pt.is_initialized():
            raise RuntimeError("DistributedOptimizer needs peertrain.init() first")
        self.optimizer, self.algorithm = optimizer, algorithm
        self._params = [p for p in model.parameters() if p.requires_grad]
        for p in self._params:
            _view(p, "DistributedOptimizer")  # float32, CPU: refused now rather than mid-training
        self._pending = {}  # id(param) -> Handle of its exchange this step
        if algorithm == "dpsgd":
            for p in self._params:
                p.register_hook(self._hook_for(p))

    def _hook_for(self, p):
        def hook(grad):
            self._start(p)
            return None
        return hook

    def _start(self, p):
        if id(p) not in self._pending:
            self._pending[id(p)] = neighbor_allreduce_nonblocking(p.data)

    def step(self, closure=None):
        if self.algorithm == "dpsgd":
            for p in self._params:  # those backward did not reach, in the same order on every peer
                self._start(p)
            with torch.no_grad():
                for p in self._params:
                    p.copy_(self._pending[id(p)].wait())
            self._pending.clear()
        else:
            with torch.no_grad():
                for p in self._params:
                    if p.grad is not None:
                        p.grad.copy_(allreduce(p.grad))
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none=False):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name):
        return getattr(self.optimizer, name)


class DiLoCo:
    """Local steps of `inner_optimizer`, and every `inner_steps` an outer step on the
    averaged pseudo-gradient (see the module's text). The replicas must start equal
    (broadcast_parameters). step() returns the inner step's result; everything else is the
    inner optimizer's."""

    EXCHANGES = ("allreduce", "gossip")

    def __init__(self, model, inner_optimizer, inner_steps=50, outer_lr=0.7, outer_momentum=0.9, nesterov=True,
                 exchange="allreduce"):
        if exchange not in self.EXCHANGES:
            raise ValueError(f"DiLoCo: exchange '{exchange}' is not one of {', '.join(self.EXCHANGES)}")
        if int(inner_steps) != inner_steps or inner_steps < 1:
            raise ValueError(f"DiLoCo: inner_steps must be an integer of at least 1, got {inner_steps}")
        if not _pt.is_initialized():
            raise RuntimeError("DiLoCo needs peertrain.init() first")
        self.optimizer, self.inner_steps, self.exchange = inner_optimizer, int(inner_steps), exchange
        self._params = [p for p in model.parameters() if p.requires_grad]
        for p in self._params:
            _view(p, "DiLoCo")  # float32, CPU: refused now rather than at the first outer step
        self._outer = [p.detach().clone() for p in self._params]
        nesterov = nesterov and outer_momentum > 0  # torch's Nesterov needs a momentum
        self.outer_optimizer = torch.optim.SGD(self._outer, lr=outer_lr, momentum=outer_momentum, nesterov=nesterov)
        self._steps = 0

    def step(self, closure=None):
        result = self.optimizer.step(closure)
        self._steps += 1
        if self._steps % self.inner_steps == 0:
            self._outer_step()
        return result

    def _outer_step(self):
        average = allreduce if self.exchange == "allreduce" else neighbor_allreduce
        with torch.no_grad():
            for p, outer in zip(self._params, self._outer):
                outer.grad = average(outer - p)
            self.outer_optimizer.step()
            for p, outer in zip(self._params, self._outer):
                p.copy_(outer)

    def zero_grad(self, set_to_none=False):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name):
        return getattr(self.optimizer, name)
