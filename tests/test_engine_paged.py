"""The paged engine: block pool and prefix cache, blocked attention's invariance, exactness with prefix sharing,
eviction and preemption under memory pressure, weight swaps mid-generation in both modes, and no request lost or
duplicated while rows join and leave at random."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from rllm_serve import load_model, step
from rllm_serve import model_runner as model_runner_module
from rllm_serve.attention_kernel import kernel_available
from rllm_serve.engine import DecodeEngine
from rllm_serve.gemm_rows import BATCH_INVARIANT, CANDIDATES, GEMM_ROW_BLOCK
from rllm_serve.kv_pool import BlockTable, KVPool, PoolExhausted, pool_shape
from rllm_serve.models import LoadedModel
from rllm_serve.packed_linear import PackedLayers
from rllm_serve.paged_attention import attend
from rllm_serve.sampling import SamplingParams
from rllm_serve.sequence import GenerationRequest
from rllm_testing.engine_requests import TokenSink, submit


# ---------------------------------------------------------------------- the pool
def test_pool_shares_prefix_blocks_and_evicts_the_least_recently_used() -> None:
    pool = KVPool(layers=1, kv_heads=1, head_dim=2, num_blocks=5, dtype=torch.float32, device=torch.device("cpu"),
                  block_size=4)
    tokens = list(range(10))
    a = BlockTable()
    pool.ensure(a, 10)
    assert len(a.blocks) == 3 and pool.free_blocks == 1
    a.computed = 10
    pool.register(a, 0, tokens)  # two full blocks enter the prefix cache
    assert pool.cached_blocks == 2
    blocks, hashes = pool.match(0, [*tokens, 99], 10)
    assert blocks == a.blocks[:2] and len(hashes) == 2
    assert pool.match(1, tokens, 10)[0] == []  # another root (version / adapter): nothing shared
    b = BlockTable(blocks, 8, hashes)
    pool.release(a)
    assert pool.free_blocks == 2  # a's private last block is free; the shared two are still b's
    pool.release(b)
    assert pool.free_blocks == 4 and pool.cached_blocks == 2  # unreferenced but cached: evictable
    c = BlockTable()
    pool.ensure(c, 16)  # needs all four: the two cached blocks are evicted
    assert pool.evictions == 2 and pool.cached_blocks == 0
    with pytest.raises(PoolExhausted):
        pool.ensure(c, 20)


def test_the_pool_commits_memory_only_for_the_blocks_written() -> None:
    psutil = pytest.importorskip("psutil")
    proc = psutil.Process()
    before = proc.memory_info().rss
    pool = KVPool(layers=4, kv_heads=4, head_dim=64, num_blocks=2048, dtype=torch.float32,
                  device=torch.device("cpu"))  # 512 MB of keys and values
    assert proc.memory_info().rss - before < 64 * 2**20
    pool.keys[0][1] = 1.0
    assert float(pool.keys[0][0].abs().sum()) == 0.0 and float(pool.values[3][2047].abs().sum()) == 0.0


def test_blocked_attention_is_the_same_bits_in_a_decode_batch_alone_and_in_a_prefill() -> None:
    gen = torch.Generator().manual_seed(0)
    kvh, g, d, bs, nb_pool = 3, 3, 16, 8, 40
    keys = torch.randn(nb_pool, kvh, bs, d, generator=gen)
    values = torch.randn(nb_pool, kvh, bs, d, generator=gen)
    length = 29
    table = torch.randperm(nb_pool - 1, generator=gen)[:4] + 1
    q = torch.randn(length, kvh, g, d, generator=gen)
    scale = 1 / math.sqrt(d)
    prefill = attend(q.permute(1, 0, 2, 3).reshape(1, kvh, length * g, d), keys, values, table[None],
                     torch.arange(length).repeat_interleave(g)[None], scale, bs)
    prefill = prefill[0].view(kvh, length, g, d).permute(1, 0, 2, 3)
    for j in (0, 7, 8, 28):
        mine = table[: j // bs + 1]
        alone = attend(q[j][None], keys, values, mine[None], torch.full((1, g), j), scale, bs)[0]
        others = torch.randint(1, nb_pool, (5, 6), generator=gen)
        padded = torch.cat([mine, torch.zeros(6 - len(mine), dtype=torch.long)])[None]
        batch = attend(torch.cat([torch.randn(5, kvh, g, d, generator=gen), q[j][None]]), keys, values,
                       torch.cat([others, padded]), torch.cat([torch.full((5, g), 40), torch.full((1, g), j)]),
                       scale, bs)[-1]
        assert torch.equal(alone, batch) and torch.equal(alone, prefill[j])
    k_seq = keys[table].permute(1, 0, 2, 3).reshape(kvh, -1, d)[:, :length].repeat_interleave(g, 0)
    v_seq = values[table].permute(1, 0, 2, 3).reshape(kvh, -1, d)[:, :length].repeat_interleave(g, 0)
    ref = torch.nn.functional.scaled_dot_product_attention(q.permute(1, 2, 0, 3).reshape(kvh * g, length, d),
                                                           k_seq, v_seq, is_causal=True)
    assert torch.allclose(ref.view(kvh, g, length, d).permute(2, 0, 1, 3), prefill, atol=1e-5)


# ---------------------------------------------------------------------- the engine
@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    torch.set_num_threads(1)
    return load_model("tiny-random")


@pytest.fixture(params=["compiled", "torch"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each engine test runs on the compiled kernels (numba attention, packed linear layers, where this machine
    has them) and on the pure-torch path that serves without them."""
    if request.param == "compiled" and not kernel_available(torch.float32, torch.device("cpu")):
        pytest.skip("numba is not installed (rllm[serve]): only the torch path can run here")
    if request.param == "torch":
        monkeypatch.setattr(step, "kernel_available", lambda *a: False)
        monkeypatch.setattr(model_runner_module, "pack_linear_layers", lambda *a, **k: PackedLayers())
    return str(request.param)


@pytest.fixture
def engine(loaded: LoadedModel, path: str) -> Iterator[DecodeEngine]:
    eng = DecodeEngine(loaded, threads=1).start()
    yield eng
    eng.stop()


Collect = TokenSink  # the name these tests grew up with


def fresh_logprobs(model: torch.nn.Module, prompt: list[int], tokens: list[int], temperature: float = 1.0
                   ) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1: -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


def assert_same_sample(a: Collect, b: Collect, choice: int) -> None:
    """The same tokens with the same logprob bits where this CPU's matmuls were measured batch-invariant
    (gemm_rows: every machine this was built on), else within float32 rounding: the tolerance docs/serving.md
    states for a CPU whose kernels change with the row count."""
    assert a.tokens(choice) == b.tokens(choice)
    if BATCH_INVARIANT:
        assert a.logprobs(choice) == b.logprobs(choice)
    else:
        assert max(abs(x - y) for x, y in zip(a.logprobs(choice), b.logprobs(choice), strict=True)) <= 1e-5


def test_the_row_block_is_measured_and_keeps_a_rows_bits() -> None:
    assert GEMM_ROW_BLOCK in CANDIDATES
    if not BATCH_INVARIANT:
        pytest.skip("this CPU's matmuls were measured not batch-invariant: the engine states a 1e-5 tolerance")
    gen = torch.Generator().manual_seed(7)
    w, x = torch.randn(320, 200, generator=gen), torch.randn(9 * GEMM_ROW_BLOCK, 200, generator=gen)
    full = torch.nn.functional.linear(x, w)
    for rows in (GEMM_ROW_BLOCK, 4 * GEMM_ROW_BLOCK, 7 * GEMM_ROW_BLOCK):
        assert torch.equal(torch.nn.functional.linear(x[GEMM_ROW_BLOCK: GEMM_ROW_BLOCK + rows], w),
                           full[GEMM_ROW_BLOCK: GEMM_ROW_BLOCK + rows])


def assert_exact(model: torch.nn.Module, prompt: list[int], got: Collect, choice: int = 0,
                 temperature: float = 1.0) -> None:
    toks = got.tokens(choice)
    assert toks, "no tokens"
    err = (fresh_logprobs(model, prompt, toks, temperature) - torch.tensor(got.logprobs(choice))).abs().max().item()
    assert err < 1e-4, err


def test_exact_logprobs_with_shared_prompts_branching_groups_and_multi_turn_reuse(
        engine: DecodeEngine, loaded: LoadedModel) -> None:
    rng = torch.Generator().manual_seed(1)
    common = torch.randint(5, 1000, (70,), generator=rng).tolist()
    prompts = [common + torch.randint(5, 1000, (k,), generator=rng).tolist() for k in (3, 40, 1)]
    jobs = [(p, 1.0, submit(engine, p, n=4, max_tokens=24, temperature=1.0, ignore_eos=True)) for p in prompts]
    jobs.append((common, 0.7, submit(engine, common, n=1, max_tokens=30, temperature=0.7, top_p=0.9)))
    for _, _, j in jobs:
        assert j.done.wait(60)
    for p, t, j in jobs:
        for c in range(j.n):
            assert_exact(loaded.model, p, j, c, temperature=t)
    assert engine.stats()["prefix_hit_blocks"] > 0  # the branching groups reused the common prefix
    # a second turn: the whole first conversation plus a new message, its history's KV reused
    first = jobs[0]
    history = first[0] + first[2].tokens(0) + torch.randint(5, 1000, (9,), generator=rng).tolist()
    hits = engine.stats()["prefix_hit_blocks"]
    turn = submit(engine, history, max_tokens=16, temperature=1.0, ignore_eos=True)
    assert turn.done.wait(60)
    assert_exact(loaded.model, history, turn)
    assert engine.stats()["prefix_hit_blocks"] - hits >= len(history) // 32 - 1


def check_seeded_alone_and_batched(engine: DecodeEngine, prompt: list[int], n: int, seed: int) -> None:
    """A seeded request, alone and then again among other requests (its prompt then from the prefix cache),
    samples the same (`assert_same_sample`)."""
    alone = submit(engine, prompt, n=n, max_tokens=20, temperature=1.0, seed=seed, ignore_eos=True)
    assert alone.done.wait(60)
    noise = [submit(engine, list(range(200 + i, 240 + 7 * i)), n=2, max_tokens=40, temperature=1.0)
             for i in range(4)]
    again = submit(engine, prompt, n=n, max_tokens=20, temperature=1.0, seed=seed, ignore_eos=True)
    assert again.done.wait(60) and all(j.done.wait(60) for j in noise)
    for c in range(n):
        assert_same_sample(alone, again, c)


def test_a_seeded_request_is_the_same_bits_alone_batched_and_from_the_prefix_cache(engine: DecodeEngine) -> None:
    check_seeded_alone_and_batched(engine, list(range(100, 180)), n=3, seed=5)


def test_eviction_and_preemption_under_memory_pressure_keep_every_request_exact(loaded: LoadedModel,
                                                                               path: str) -> None:
    """A pool of 12 blocks of 32 tokens for 8 requests of up to ~150 tokens: cached prefixes are evicted and
    choices preempted (their KV dropped, prefilled again later); every output still matches a fresh forward and
    a seeded request gives the same bits as with plenty of memory."""
    per_block = KVPool.bytes_per_block(*pool_shape(loaded.model.config), torch.float32)
    small = DecodeEngine(loaded, threads=1, kv_cache_gb=12 * per_block / 2**30).start()
    big = DecodeEngine(loaded, threads=1).start()
    try:
        assert small.pool.num_blocks == 12
        prompts = [list(range(10 + 50 * i, 10 + 50 * i + 60 + 5 * i)) for i in range(8)]
        jobs = [submit(small, p, n=2 if i % 3 == 0 else 1, max_tokens=70, temperature=1.0, seed=i, ignore_eos=True)
                for i, p in enumerate(prompts)]
        refs = [submit(big, p, n=2 if i % 3 == 0 else 1, max_tokens=70, temperature=1.0, seed=i, ignore_eos=True)
                for i, p in enumerate(prompts)]
        for j in [*jobs, *refs]:
            assert j.done.wait(120)
        assert small.stats()["kv_evictions"] > 0
        for p, j, r in zip(prompts, jobs, refs, strict=True):
            for c in range(j.n):
                assert len(j.tokens(c)) == 70
                assert_same_sample(j, r, c)
            assert_exact(loaded.model, p, j)
    finally:
        small.stop()
        big.stop()


def perturb(model: torch.nn.Module, scale: float = 0.05) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {k: v + scale * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}


def wait_tokens(job: Collect, n: int) -> None:
    for _ in range(2000):
        if len(job.tokens(0)) >= n:
            return
        threading.Event().wait(0.005)
    raise AssertionError("the request did not start")


@pytest.mark.parametrize("mode", ["finish", "resume"])
def test_a_swap_mid_generation_tags_every_token_with_its_version(mode: str, path: str) -> None:
    loaded = load_model("tiny-random")
    old = load_model("tiny-random").model
    eng = DecodeEngine(loaded, threads=1, swap_mode=mode).start()  # type: ignore[arg-type]
    try:
        prompt = list(range(300, 340))
        running = submit(eng, prompt, max_tokens=600, temperature=1.0, ignore_eos=True)
        wait_tokens(running, 5)
        assert eng.update_weights(perturb(loaded.model), timeout=30) == 1
        after = submit(eng, prompt, max_tokens=10, temperature=1.0, ignore_eos=True)
        assert running.done.wait(120) and after.done.wait(60)
    finally:
        eng.stop()
    assert set(after.versions(0)) == {1}
    assert_exact(loaded.model, prompt, after)  # the new request: new weights
    versions, toks, lps = running.versions(0), running.tokens(0), torch.tensor(running.logprobs(0))
    assert len(toks) == 600 and versions == sorted(versions)
    if mode == "finish":
        assert set(versions) == {0}
        assert_exact(old, prompt, running)  # the whole completion on the weights it started with
    else:
        cut = versions.index(1)
        assert 5 <= cut < 600 and set(versions[cut:]) == {1}
        ref_old = fresh_logprobs(old, prompt, toks)
        ref_new = fresh_logprobs(loaded.model, prompt, toks)
        assert (ref_old[:cut] - lps[:cut]).abs().max() < 1e-4
        assert (ref_new[cut:] - lps[cut:]).abs().max() < 1e-4  # resumed: its history prefilled on the new weights


@pytest.mark.parametrize("mode", ["finish", "resume"])
def test_an_owned_model_swapped_mid_generation_keeps_both_weight_sets_apart(mode: str) -> None:
    """own_model=True (what `rllm serve` and the trainers use): the dense weights are gone, q|k|v and gate|up are
    fused, and a "finish" copy of the model must keep serving from the old packed weights."""
    if not kernel_available(torch.float32, torch.device("cpu")):
        pytest.skip("numba is not installed (rllm[serve]): nothing is fused without the compiled kernel")
    old = load_model("tiny-random").model
    new_weights = perturb(old)
    new = load_model("tiny-random").model
    new.load_state_dict(new_weights)
    eng = DecodeEngine(load_model("tiny-random"), threads=1, swap_mode=mode, own_model=True).start()  # type: ignore[arg-type]
    try:
        prompt = list(range(300, 340))
        running = submit(eng, prompt, max_tokens=200, temperature=1.0, ignore_eos=True)
        wait_tokens(running, 5)
        assert eng.model.model.layers[0].mlp.up_proj.weight.is_meta  # released, fused
        assert eng.update_weights(new_weights, timeout=30) == 1
        after = submit(eng, prompt, max_tokens=10, temperature=1.0, ignore_eos=True)
        assert running.done.wait(120) and after.done.wait(60)
    finally:
        eng.stop()
    assert set(after.versions(0)) == {1}
    assert_exact(new, prompt, after)
    versions, toks, lps = running.versions(0), running.tokens(0), torch.tensor(running.logprobs(0))
    cut = versions.index(1) if 1 in versions else len(versions)
    assert (mode == "finish") == (cut == len(versions)) and len(toks) == 200
    assert (fresh_logprobs(old, prompt, toks)[:cut] - lps[:cut]).abs().max() < 1e-4
    if cut < len(toks):
        assert (fresh_logprobs(new, prompt, toks)[cut:] - lps[cut:]).abs().max() < 1e-4


@settings(max_examples=8, deadline=None, phases=[Phase.explicit, Phase.generate], derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 90), st.integers(1, 3), st.integers(1, 40), st.booleans()),
                min_size=3, max_size=10))
def test_no_request_is_lost_or_duplicated_as_rows_join_and_leave(engine: DecodeEngine,
                                                                 reqs: list[tuple[int, int, int, bool]]) -> None:
    jobs = []
    for i, (plen, n, max_tokens, cancel) in enumerate(reqs):
        sink = Collect(n)
        req = GenerationRequest(list(range(7 + i, 7 + i + plen)), SamplingParams(max_tokens=max_tokens,
                                temperature=1.0), sink, n=n)
        engine.submit(req)
        jobs.append((req, sink, max_tokens))
        if cancel:
            req.cancel()
    for req, sink, max_tokens in jobs:
        assert sink.done.wait(60)
        for c in range(req.n):
            ends = [e for e in sink.events if e.choice == c and e.finish_reason is not None]
            assert len(ends) == 1, f"choice {c} ended {len(ends)} times"
            assert sink.events.index(ends[0]) == max(i for i, e in enumerate(sink.events) if e.choice == c)
            assert len(sink.tokens(c)) <= max_tokens
            if not req.cancelled.is_set():
                assert ends[0].finish_reason in ("stop", "length")
    deadline = threading.Event()
    for _ in range(200):
        if engine.running == 0:
            break
        deadline.wait(0.01)
    assert engine.running == 0 and engine.pool.free_blocks == engine.pool.num_blocks - 1
