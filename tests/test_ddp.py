"""cek.torch.CosineEmbeddingLoss under DistributedDataParallel: two CPU processes (gloo, on
the loopback interface only) each train on half the batch, and the weights must match one
process training on the whole batch. The processes meet through a file, not a TCP port, so no
port can be taken by another program between choosing it and binding it."""

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import cek.torch as ct  # noqa: E402

STEPS, BATCH, WORLD = 3, 8, 2


def _model():
    torch.manual_seed(0)
    return torch.nn.Embedding(16, 8, dtype=torch.float64)


def _batch(step):
    g = torch.Generator().manual_seed(100 + step)
    left = torch.randint(0, 16, (BATCH,), generator=g)
    right = torch.randint(0, 16, (BATCH,), generator=g)
    labels = torch.tensor([1.0, -1.0] * (BATCH // 2), dtype=torch.float64)
    return left, right, labels


def _train(model, rows=slice(None)):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loss_fn = ct.CosineEmbeddingLoss(margin=0.1)
    for step in range(STEPS):
        left, right, labels = (t[rows] for t in _batch(step))
        optimizer.zero_grad()
        loss_fn(model(left), model(right), labels).backward()
        optimizer.step()
    return model


def _worker(rank, store, out):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        half = BATCH // WORLD
        model = torch.nn.parallel.DistributedDataParallel(_model())
        _train(model, slice(rank * half, (rank + 1) * half))
        if rank == 0:
            torch.save(model.module.state_dict(), out)
        # Both ranks reach the teardown together. Once (1 of 4 full runs on a loaded 2-core
        # machine; not again in 8 runs beside two busy processes) rank 1 aborted at exit with
        # "terminate called without an active exception" from gloo; a barrier before
        # destroy_process_group is the usual guard against tearing down mid-exchange.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_ddp_matches_single_process(tmp_path, monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # gloo's own connections: loopback only
    out = tmp_path / "weights.pt"
    mp.spawn(_worker, args=(str(tmp_path / "store"), str(out)), nprocs=WORLD, join=True)
    ddp = torch.load(out)
    single = _train(_model()).state_dict()
    assert not torch.equal(single["weight"], _model().weight)  # training moved the weights
    # DDP averages the two halves' mean gradients: the mean over the batch, up to rounding.
    torch.testing.assert_close(ddp["weight"], single["weight"], rtol=1e-12, atol=1e-14)
