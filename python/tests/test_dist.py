"""bitparity.dist over gloo, two processes on the CPU: a row-parallel linear, the
column-parallel q/k/v and the MLP, each rank holding its slice of the unsharded weights,
give the unsharded ops' bits: the row-parallel output on every rank, its input and weight
gradients' slices; the q/k/v outputs' slices, their weight gradients' slices and the
input gradient on every rank; the MLP's output and input gradient on every rank and its
weight gradients' slices; the vocabulary-parallel LM head and logprob under all four
contracts: the logprob, entropy and input gradient on every rank and the head's gradient
slices; q/k norms on a rank's heads (or replicated kv heads): their weight gradient on every
rank; a weight gradient over rows shared out by sequence (the token split); context-parallel
attention over zigzag parts and the expert-parallel MoE block, ranks holding different
tokens: every rank's rows and gradients; patched models tensor-, data/expert- and
context-parallel. The negative controls: a rank summing its K slice (or its vocabulary
slice, for the head's input gradient) as one chain instead of its chunks' subtree (what a
plain sharded matmul does) differs, and so do a norm's weight gradient reduced from each
rank's partial, a data-parallel merge of per-rank weight gradients and a CP rank attending
only its own keys."""

import os

import pytest
import torch
import torch.distributed as torch_dist
import torch.multiprocessing as mp

import bitparity.ops as ops

if ops._C is None and os.environ.get("BITPARITY_REQUIRE_OPS") != "1":
    pytest.skip("this installation has no bitparity._C (docs/torch-ops.md)", allow_module_level=True)

import bitparity.dist as bdist  # noqa: E402
import tiny_qwen3  # noqa: E402

WORLD, T, H, NQ, NKV, I = 2, 16, 512, 256, 128, 384


def data():
    """Inputs and weights, bf16 values (weights as fp32 masters), and the gradients arriving."""
    g = torch.Generator().manual_seed(11)
    r = lambda *shape: torch.randn(*shape, generator=g).to(torch.bfloat16)  # noqa: E731
    return {"x": r(T, H), "wo": r(H, H).float(), "dy": r(T, H), "a": r(T, H), "wq": r(NQ, H).float(),
            "wk": r(NKV, H).float(), "wv": r(NKV, H).float(), "dq": r(T, NQ), "dk": r(T, NKV), "dv": r(T, NKV),
            "wg": r(I, H).float(), "wu": r(I, H).float(), "wd": r(H, I).float(), "dd": r(T, H)}


def rows(t, rank):
    n = t.shape[0] // WORLD
    return t[rank * n:(rank + 1) * n]


def cols(t, rank):
    n = t.shape[1] // WORLD
    return t[:, rank * n:(rank + 1) * n].contiguous()


def _rank(rank, store, out, name):
    torch_dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD)
    try:
        c, d = ops.contract(name), data()
        x = cols(d["x"], rank).requires_grad_(True)
        wo = cols(d["wo"], rank).requires_grad_(True)
        y = bdist.row_parallel_linear(x, wo, c)
        y.backward(d["dy"])
        a = d["a"].clone().requires_grad_(True)
        ws = [rows(d[k], rank).clone().requires_grad_(True) for k in ("wq", "wk", "wv")]
        qkv = bdist.qkv(a, *ws, c)
        torch.autograd.backward(qkv, [cols(d[k], rank) for k in ("dq", "dk", "dv")])
        a2 = d["a"].clone().requires_grad_(True)
        mw = [rows(d["wg"], rank).clone().requires_grad_(True), rows(d["wu"], rank).clone().requires_grad_(True),
              cols(d["wd"], rank).requires_grad_(True)]
        mlp_out = bdist.mlp(a2, *mw, c)
        mlp_out.backward(d["dd"])
        # The control: this rank's K slice summed as one chain, then the same tree over ranks.
        chain = ops._C.linear_acc(x.detach(), wo.detach().to(torch.bfloat16), 1, x.shape[1], name)
        y_chain = ops._C.sum_round([ops._C.rank_tree(bdist._gather(chain, None))])
        torch.save({"y": y.detach(), "dx": x.grad, "dwo": wo.grad, "qkv": [t.detach() for t in qkv], "da": a.grad,
                    "dw": [w.grad for w in ws], "y_chain": y_chain, "mlp": mlp_out.detach(), "mlp_da": a2.grad,
                    "mlp_dw": [w.grad for w in mw]}, os.path.join(out, f"rank{rank}.pt"))
    finally:
        torch_dist.destroy_process_group()


@pytest.mark.parametrize("name", ["bf16-sm90tc-v3", "bf16-fmaseq-v3"])
def test_tensor_parallel_linears_are_the_unsharded_bits(tmp_path, name):
    mp.start_processes(_rank, args=(str(tmp_path / "store"), str(tmp_path), name), nprocs=WORLD, start_method="fork")
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    c, d = ops.contract(name), data()
    x, wo = d["x"].clone().requires_grad_(True), d["wo"].clone().requires_grad_(True)
    y = ops.linear(x, wo, c, k_chunks=c.tp_tree_width)
    y.backward(d["dy"])
    a = d["a"].clone().requires_grad_(True)
    ws = [d[k].clone().requires_grad_(True) for k in ("wq", "wk", "wv")]
    qkv = ops.qkv(a, *ws, c)
    torch.autograd.backward(qkv, [d[k] for k in ("dq", "dk", "dv")])
    a2 = d["a"].clone().requires_grad_(True)
    mw = [d[k].clone().requires_grad_(True) for k in ("wg", "wu", "wd")]
    mlp_out = ops.mlp(a2, *mw, c)
    mlp_out.backward(d["dd"])
    for r, g in enumerate(got):
        assert torch.equal(g["mlp"], mlp_out.detach()), r
        assert torch.equal(g["mlp_da"], a2.grad), r
        for mine, full, cut in zip(g["mlp_dw"], mw, (rows, rows, cols)):
            assert torch.equal(mine, cut(full.grad, r)), r
        assert torch.equal(g["y"], y.detach()), r
        assert torch.equal(g["dx"], cols(x.grad, r)), r
        assert torch.equal(g["dwo"], cols(wo.grad, r)), r
        for mine, full, w_mine, w_full in zip(g["qkv"], qkv, g["dw"], ws):
            assert torch.equal(mine, cols(full.detach(), r)), r
            assert torch.equal(w_mine, rows(w_full.grad, r)), r
        assert torch.equal(g["da"], a.grad), r
    if name == "bf16-fmaseq-v3":  # a chain per rank is not the chunks' subtree
        assert not torch.equal(got[0]["y_chain"], y.detach())


V, HV, TV = 4000, 512, 32
ALL_CONTRACTS = ["bf16-sm90tc-v3", "bf16-fmaseq-v3", "bf16-sm90tc-v2", "bf16-fmaseq-v2", "bf16-sm90tc-v1",
                 "bf16-fmaseq-v1"]


def vocab_data():
    """The final norm's output h, the LM head, every row's target (across both halves of
    the vocabulary) and the loss's coefficients."""
    g = torch.Generator().manual_seed(12)
    r = lambda *shape: torch.randn(*shape, generator=g).to(torch.bfloat16)  # noqa: E731
    targets = torch.randint(0, V, (TV - 1,), generator=g, dtype=torch.int32)
    return {"h": r(TV, HV), "w": (r(V, HV) * 0.0625).float(), "targets": targets, "rows": torch.arange(TV - 1),
            "coef": torch.randn(TV - 1, generator=g)}


def _vocab_rank(rank, store, out, name):
    torch_dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD)
    try:
        c, d = ops.contract(name), vocab_data()
        h = d["h"].clone().requires_grad_(True)
        part = bdist.chunk_slice(V, c, rank, WORLD)
        w = d["w"][part].clone().requires_grad_(True)
        lp, entropy = bdist.lm_head_logprob(h, w, d["rows"], d["targets"], c, vocab=V)
        (lp * d["coef"]).sum().backward()
        # The control: h's gradient as a plain sharded matmul gives it, this rank's vocabulary
        # slice one chain (the same dlogits), then the same tree over ranks.
        bw = w.detach().to(torch.bfloat16)
        sel = ops._C.linear_fwd(d["h"], bw, 1, name)[d["rows"]].contiguous()
        _, _, M, S = bdist._merged_logprob(sel, d["targets"], part.stop - part.start, V, c, None, 1.0)
        dsel = ops._C.logprob_bwd_slice(sel, d["targets"], part.start, d["coef"], M, S, 1.0, name)
        dlogits = dsel.new_zeros(TV, bw.shape[0]).index_put((d["rows"],), dsel)
        chain = ops._C.linear_dgrad_acc(dlogits, bw, 1, bw.shape[0], name)
        dh_chain = ops._C.sum_round([ops._C.rank_tree(bdist._gather(chain, None))])
        torch.save({"lp": lp.detach(), "entropy": entropy, "dh": h.grad, "dw": w.grad, "dh_chain": dh_chain},
                    os.path.join(out, f"vocab{rank}.pt"))
    finally:
        torch_dist.destroy_process_group()


@pytest.mark.parametrize("name", ALL_CONTRACTS)
def test_vocabulary_parallel_head_is_the_unsharded_bits(tmp_path, name):
    """The LM head and logprob with each rank holding its chunks of the vocabulary: the
    logprob and entropy on every rank, h's gradient on every rank and each rank's slice of
    the head's gradient are the unsharded ops' bits, under v2's one gather of chunk states
    and v1's two. The negative control (fma-seq): a rank's slice of h's gradient as one
    chain differs."""
    mp.start_processes(_vocab_rank, args=(str(tmp_path / "store"), str(tmp_path), name), nprocs=WORLD,
                       start_method="fork")
    got = [torch.load(tmp_path / f"vocab{r}.pt") for r in range(WORLD)]
    c, d = ops.contract(name), vocab_data()
    h, w = d["h"].clone().requires_grad_(True), d["w"].clone().requires_grad_(True)
    lp, entropy = ops.logprob(ops.linear(h, w, c, n_chunks=c.tp_tree_width)[d["rows"]], d["targets"], c)
    (lp * d["coef"]).sum().backward()
    for r, g in enumerate(got):
        assert torch.equal(g["lp"], lp.detach()), r
        assert torch.equal(g["entropy"], entropy), r
        assert torch.equal(g["dh"], h.grad), r
        assert torch.equal(g["dw"], w.grad[bdist.chunk_slice(V, c, r, WORLD)]), r
    if name.startswith("bf16-fmaseq"):
        assert not torch.equal(got[0]["dh_chain"], h.grad)


def test_chunk_slice_refuses_a_rank_without_rows():
    c = ops.contract("bf16-sm90tc-v3")
    assert bdist.chunk_slice(V, c, 1, 2) == slice(V // 2, V)
    with pytest.raises(ValueError, match="holds none of 9"):
        bdist.chunk_slice(9, c, 7, 8)


HEADS, D = 4, 64


def _norm_rank(rank, store, out, name, heads):
    torch_dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD)
    try:
        c, (x, w, dy) = ops.contract(name), norm_data(heads)
        replicas = max(1, WORLD // heads)
        mine = max(1, heads // WORLD)
        first = rank // replicas * mine
        xs = x[:, first * D:(first + mine) * D].contiguous().requires_grad_(True)
        wr = w.clone().requires_grad_(True)
        bdist.head_norm(xs, wr, 1e-6, c, heads=mine, replicas=replicas).backward(
            dy[:, first * D:(first + mine) * D].contiguous())
        # The control: the rank's own rows' weight gradient, then the tree over ranks (a
        # plain TP all-reduce of partial weight gradients, in the contract's order).
        _, dw_mine = ops._C.rmsnorm_bwd(xs.detach().contiguous(), w.to(torch.bfloat16),
                                        ops._C.rmsnorm_fwd(xs.detach(), w.to(torch.bfloat16), 1e-6, mine, name)[1],
                                        dy[:, first * D:(first + mine) * D].contiguous(), mine, name)
        torch.save({"dx": xs.grad, "dw": wr.grad, "dw_tree": ops._C.rank_tree(bdist._gather(dw_mine, None))},
                   os.path.join(out, f"norm{rank}.pt"))
    finally:
        torch_dist.destroy_process_group()


def norm_data(heads):
    g = torch.Generator().manual_seed(13)
    x = torch.randn(T, heads * D, generator=g).to(torch.bfloat16)
    return x, torch.randn(D, generator=g).to(torch.bfloat16).float(), torch.randn(T, heads * D, generator=g).to(
        torch.bfloat16)


@pytest.mark.parametrize("heads", [HEADS, 1], ids=["split", "replicated"])
@pytest.mark.parametrize("name", ["bf16-sm90tc-v3", "bf16-fmaseq-v1"])
def test_head_norm_weight_gradient_is_the_unsharded_bits(tmp_path, name, heads):
    """q_norm / k_norm on each rank's heads (split: two heads a rank; replicated: one kv head
    held by both ranks): x's gradient slice and the weight's gradient on every rank are the
    unsharded norm's bits. The control: each rank's partial weight gradient, reduced over
    ranks, differs."""
    mp.start_processes(_norm_rank, args=(str(tmp_path / "store"), str(tmp_path), name, heads), nprocs=WORLD,
                       start_method="fork")
    got = [torch.load(tmp_path / f"norm{r}.pt") for r in range(WORLD)]
    c, (x, w, dy) = ops.contract(name), norm_data(heads)
    x, w = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    ops.rmsnorm(x, w, 1e-6, c, heads=heads).backward(dy)
    replicas, mine = max(1, WORLD // heads), max(1, heads // WORLD)
    for r, g in enumerate(got):
        first = r // replicas * mine
        assert torch.equal(g["dx"], x.grad[:, first * D:(first + mine) * D]), r
        assert torch.equal(g["dw"], w.grad), r
    if replicas == 1:
        assert not torch.equal(got[0]["dw_tree"], w.grad)


HF_MODEL = os.path.join(os.environ.get("BP_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                        "fixtures", "hf", "dense-gqa1-untied-sharded")
MOE_MODEL = os.path.join(os.path.dirname(HF_MODEL), "qwen3-moe-tiny")
TIED_MODEL = os.path.join(os.path.dirname(HF_MODEL), "qwen3-dense-tiny")
MQA_MODEL = os.path.join(os.path.dirname(HF_MODEL), "dense-mqa8-oddsize-tied")  # one kv head: replicated
SEQS = [[5, 17, 3, 44, 9, 100, 2], [61, 2, 70, 11]]
COEFS = [[0.5, -1.25, 2.0, 0.75, 1.0, -0.5], [1.5, 0.25, -2.0]]


def patched_step(model):
    """The padded batch of SEQS (the second row left-padded) through a patched model, and
    the backward of sum c_t · logprob_t: (logprobs, entropy, gradients by name)."""
    ids, mask, coef = tiny_qwen3.padded_batch(SEQS, COEFS)
    out = model(ids, attention_mask=mask)
    (out.logprobs * coef).sum().backward()
    return out.logprobs.detach(), out.entropy, {n: p.grad for n, p in model.named_parameters()}


def engine_row_parallel(x, weight, c, group=None, k_full=None):
    """The control's o_proj, as engines run it: each rank's partial (its K slice one chain)
    rounded to bf16, then the ranks' partials summed in bf16 (a bf16 all-reduce)."""
    partial = ops._C.linear_fwd(x, ops._as_bf16(weight, "w"), 1, c.name)
    parts = bdist._gather(partial, group)
    return sum(parts[1:], parts[0])


def rollout_logprobs(model, c, gather_vocab=None):
    """A chunked prefill (4 tokens of the first sequence beside 1 of the second, left-padded)
    and three decoding steps through the patched model's cache, under torch.no_grad(): the
    contract logprob of every position whose next token the calls saw. gather_vocab puts a
    tensor-parallel rank's vocabulary slices of the logits back together."""
    import bitparity
    s0, s1 = SEQS
    with torch.no_grad():
        out = model(torch.tensor([s0[:4], [0, 0, 0, s1[0]]]), attention_mask=torch.tensor([[1, 1, 1, 1], [0, 0, 0, 1]]),
                    use_cache=True)
        rows = [list(out.logits[0]), [out.logits[1, 3]]]
        for t in range(3):
            out = model(torch.tensor([[s0[4 + t]], [s1[1 + t]]]), past_key_values=out.past_key_values, use_cache=True)
            rows[0].append(out.logits[0, 0])
            rows[1].append(out.logits[1, 0])
    whole = [torch.stack(r[:-1]) for r in rows]
    if gather_vocab:
        whole = [gather_vocab(w) for w in whole]
    return [bitparity.ops.logprob(w, torch.tensor(seq[1:len(w) + 1]), c)[0] for w, seq in zip(whole, SEQS)]


def tp_share(whole, name, t, path, c, like):
    """Rank t's slice (of TP 2) of the unsharded parameter `name`'s gradient, as
    shard_tensor_parallel cuts the parameter: q/k/v rows of its heads (a lone kv head
    replicated), o_proj's columns, the dense MLP's and the vocabulary's chunks; the rest
    whole. `like`: the rank's gradient (its slice's length along the cut)."""
    cfg = tiny_qwen3.checkpoint_config(path)
    q_dim, kv_dim = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]

    def share(n):
        return slice(t * n // WORLD, (t + 1) * n // WORLD)
    inter, vocab = (bdist.chunk_slice(cfg[k], c, t, WORLD) for k in ("intermediate_size", "vocab_size"))
    kv = share(kv_dim) if kv_dim >= WORLD * cfg["head_dim"] else slice(0, kv_dim)  # one kv head: replicated
    cuts = {"q_proj": (share(q_dim), 0), "k_proj": (kv, 0), "v_proj": (kv, 0), "o_proj": (share(q_dim), 1),
            "gate_proj": (inter, 0), "up_proj": (inter, 0), "down_proj": (inter, 1), "lm_head": (vocab, 0)}
    part, dim = next((v for k, v in cuts.items() if f"{k}.weight" in name and ".experts." not in name),
                     (slice(None), 0))
    return whole.narrow(dim, part.start or 0, like.shape[dim])


def _patched_rank(rank, store, out, name, path):
    import bitparity
    torch_dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD)
    try:
        group = torch_dist.group.WORLD
        model = bitparity.patch(tiny_qwen3.load(path), name, tp_group=group)
        lp, entropy, grads = patched_step(model)
        rollout = rollout_logprobs(model, ops.contract(name),  # the ranks' vocabulary slices side by side
                                   lambda w: torch.cat(bdist._gather_rows(w.T.contiguous(), None)).T)
        bdist.row_parallel_linear = engine_row_parallel  # this forked process only
        control = patched_step(bitparity.patch(tiny_qwen3.load(path), name, tp_group=group))[0]
        torch.save({"lp": lp, "entropy": entropy, "grads": grads, "control": control, "rollout": rollout},
                   os.path.join(out, f"patched{rank}.pt"))
    finally:
        torch_dist.destroy_process_group()


@pytest.mark.parametrize("path", [HF_MODEL, MOE_MODEL, TIED_MODEL, MQA_MODEL], ids=["dense", "moe", "tied", "mqa"])
@pytest.mark.parametrize("name", ["bf16-sm90tc-v3", "bf16-fmaseq-v1"])
def test_a_tensor_parallel_patched_model_is_the_unsharded_bits(tmp_path, name, path):
    """bitparity.patch(model, contract, tp_group) of a Qwen3, a Qwen3-MoE, a tied Qwen3 and an
    MQA Qwen3 (one kv head, replicated on both ranks) on two ranks (half the query heads, the
    dense MLPs' chunks and the vocabulary's each; the experts and a tied head whole on both):
    the logprobs and entropy on
    every rank, and every parameter's gradient cut as the rank's parameter, are the
    unsharded patched model's (itself `bitparity run`'s: test_ops.py), and so are the
    logprobs of a chunked prefill and decoding through the cache, from the ranks'
    vocabulary slices of the logits put together. The control: o_proj
    reduced as engines do (partials rounded to bf16, summed in bf16) makes the logprobs
    differ."""
    import bitparity
    mp.start_processes(_patched_rank, args=(str(tmp_path / "store"), str(tmp_path), name, path), nprocs=WORLD,
                       start_method="fork")
    lp, entropy, grads = patched_step(bitparity.patch(tiny_qwen3.load(path), name))
    rollout = rollout_logprobs(bitparity.patch(tiny_qwen3.load(path), name), ops.contract(name))
    c = ops.contract(name)
    for r in range(WORLD):
        got = torch.load(tmp_path / f"patched{r}.pt")
        assert torch.equal(got["lp"], lp) and torch.equal(got["entropy"], entropy), r
        assert set(got["grads"]) == set(grads)
        for n, g in grads.items():
            assert torch.equal(got["grads"][n], tp_share(g, n, r, path, c, got["grads"][n])), (r, n)
        assert not torch.equal(got["control"], lp), r
        for b, (mine, whole) in enumerate(zip(got["rollout"], rollout)):
            assert torch.equal(mine, whole), (r, b)


LENGTHS = [150, 97, 260, 41, 75]  # sequences of the canonical batch, several grad_token_chunks long
NT, KT = 48, 40


def split_data():
    g = torch.Generator().manual_seed(14)
    T = sum(LENGTHS)
    return torch.randn(T, NT, generator=g).to(torch.bfloat16), torch.randn(T, KT, generator=g).to(torch.bfloat16)


def rank_rows(rank):
    """The global rows of the sequences rank holds: sequence s on rank s mod 2 (SPEC.md §7)."""
    starts = [sum(LENGTHS[:s]) for s in range(len(LENGTHS))]
    return torch.cat([torch.arange(starts[s], starts[s] + n) for s, n in enumerate(LENGTHS) if s % WORLD == rank])


def _split_rank(rank, store, out, name):
    torch_dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD)
    try:
        c, (dy, x), rows = ops.contract(name), split_data(), rank_rows(rank)
        dw = bdist.token_split_wgrad(dy[rows], x[rows], rows, c)
        # The control: each rank's own rows reduced alone, then the tree over ranks (DDP's shape).
        local = ops._C.rank_tree(bdist._gather(ops._C.linear_wgrad(x[rows], dy[rows], name), None))
        torch.save({"dw": dw, "local": local}, os.path.join(out, f"split{rank}.pt"))
    finally:
        torch_dist.destroy_process_group()


@pytest.mark.parametrize("name", ["bf16-sm90tc-v3", "bf16-fmaseq-v1"])
def test_token_split_weight_gradient_is_the_unsharded_bits(tmp_path, name):
    """Five sequences shared out by sequence (s mod 2): the weight gradient by the token split
    equals linear_wgrad over the whole batch on both ranks; each rank reducing its own rows
    and the ranks' results merged (a data-parallel all-reduce's shape) differs."""
    mp.start_processes(_split_rank, args=(str(tmp_path / "store"), str(tmp_path), name), nprocs=WORLD,
                       start_method="fork")
    dy, x = split_data()
    whole = ops._C.linear_wgrad(x, dy, name)
    got = [torch.load(tmp_path / f"split{r}.pt") for r in range(WORLD)]
    for r, g in enumerate(got):
        assert torch.equal(g["dw"], whole), r
    assert not torch.equal(got[0]["local"], whole)


CP_LENGTHS, CP_HQ, CP_HKV, CP_D = [150, 37, 90], 4, 2, 64  # past a key block (64) and a query chunk


def cp_data():
    """q, k, v of the packed batch and the gradient arriving at the output."""
    g = torch.Generator().manual_seed(15)
    r = lambda heads: torch.randn(sum(CP_LENGTHS), heads * CP_D, generator=g).to(torch.bfloat16)  # noqa: E731
    return r(CP_HQ), r(CP_HKV), r(CP_HKV), r(CP_HQ)


def zigzag_rows(rank):
    """The global rows of rank under zigzag CP (SPEC.md §7): each sequence cut into 2·WORLD
    parts, part i to rank i for i < WORLD, else to rank 2·WORLD − 1 − i."""
    rows, at, n = [], 0, 2 * WORLD
    for S in CP_LENGTHS:
        for i in range(n):
            if (i if i < WORLD else n - 1 - i) == rank:
                rows += range(at + i * S // n, at + (i + 1) * S // n)
        at += S
    return torch.tensor(rows)


def _cp_rank(rank, store, out, name):
    torch_dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD)
    try:
        c, (q, k, v, dout), rows = ops.contract(name), cp_data(), zigzag_rows(rank)
        mine = [t[rows].clone().requires_grad_(True) for t in (q, k, v)]
        o = bdist.context_parallel_attention(*mine, rows, CP_LENGTHS, CP_D, c)
        o.backward(dout[rows])
        # The control: CP without the key exchange, the rank's own rows attended as if each
        # sequence's parts were one run.
        starts = [sum(CP_LENGTHS[:s]) for s in range(len(CP_LENGTHS))]
        own = [int(((rows >= a) & (rows < a + n)).sum()) for a, n in zip(starts, CP_LENGTHS)]
        alone = ops.attention(q[rows], k[rows], v[rows], own, CP_D, c)
        torch.save({"rows": rows, "o": o.detach(), "grads": [t.grad for t in mine], "alone": alone.detach()},
                   os.path.join(out, f"cp{rank}.pt"))
    finally:
        torch_dist.destroy_process_group()


@pytest.mark.parametrize("name", ["bf16-sm90tc-v3", "bf16-fmaseq-v1"])
def test_context_parallel_attention_is_the_unsharded_bits(tmp_path, name):
    """Three sequences cut zigzag over two ranks: each rank's output rows and its q, k, v
    gradient rows are the unsharded attention's, bit for bit. The negative control: a rank
    attending only the keys it holds (no exchange) differs."""
    mp.start_processes(_cp_rank, args=(str(tmp_path / "store"), str(tmp_path), name), nprocs=WORLD,
                       start_method="fork")
    c, (q, k, v, dout) = ops.contract(name), cp_data()
    whole = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o = ops.attention(*whole, CP_LENGTHS, CP_D, c)
    o.backward(dout)
    got = [torch.load(tmp_path / f"cp{r}.pt") for r in range(WORLD)]
    assert sorted(torch.cat([g["rows"] for g in got]).tolist()) == list(range(sum(CP_LENGTHS)))
    for r, g in enumerate(got):
        assert torch.equal(g["o"], o.detach()[g["rows"]]), r
        for name_, mine, full in zip("qkv", g["grads"], whole):
            assert torch.equal(mine, full.grad[g["rows"]]), (r, name_)
    assert not all(torch.equal(g["alone"], o.detach()[g["rows"]]) for g in got)


def test_context_parallel_attention_refuses_rows_that_are_not_the_batch():
    """Rows given twice or missing, and lengths that are not the rows', are named."""
    c, (q, k, v, _) = ops.contract("bf16-sm90tc-v3"), cp_data()
    with pytest.raises(ValueError, match="row indices for"):
        bdist.context_parallel_attention(q, k, v, torch.arange(3), CP_LENGTHS, CP_D, c)


EP_H, EP_E, EP_K, EP_I = 64, 8, 2, 32


def ep_data():
    """a [T, H] and the gradient arriving at the block's output (bf16), the router [E, H] and
    each expert's gate, up [I, H] and down [H, I] (fp32 masters holding bf16 values)."""
    g = torch.Generator().manual_seed(16)
    r = lambda *shape: torch.randn(*shape, generator=g).to(torch.bfloat16)  # noqa: E731
    T = sum(LENGTHS)
    experts = [(r(EP_I, EP_H).float(), r(EP_I, EP_H).float(), r(EP_H, EP_I).float()) for _ in range(EP_E)]
    return r(T, EP_H), r(T, EP_H), r(EP_E, EP_H).float(), experts


def _ep_rank(rank, store, out, name):
    torch_dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD)
    try:
        c, (a, dout, router, experts), rows = ops.contract(name), ep_data(), rank_rows(rank)
        per = EP_E // WORLD
        mine_a, mine_router = a[rows].clone().requires_grad_(True), router.clone().requires_grad_(True)
        mine = [tuple(w.clone().requires_grad_(True) for w in e) for e in experts[rank * per:(rank + 1) * per]]
        y = bdist.expert_parallel_moe(mine_a, rows, mine_router, mine, EP_E, EP_K, True, c)
        y.backward(dout[rows])
        # The control: data parallelism, every expert on every rank, each rank's router
        # gradient over its own tokens merged by the tree over ranks (an all-reduce's shape).
        dp_router = router.clone().requires_grad_(True)
        ops.moe(a[rows], dp_router, experts, EP_K, True, c).backward(dout[rows])
        merged = ops._C.rank_tree(bdist._gather(dp_router.grad, None))
        try:  # a rank holding other than E/P experts is named
            bdist.expert_parallel_moe(a[rows], rows, router, experts[:3], EP_E, EP_K, True, c)
            refused = None
        except ValueError as e:
            refused = str(e)
        torch.save({"y": y.detach(), "da": mine_a.grad, "drouter": mine_router.grad,
                    "dexperts": [[w.grad for w in e] for e in mine], "dp_router": merged, "refused": refused},
                   os.path.join(out, f"ep{rank}.pt"))
    finally:
        torch_dist.destroy_process_group()


@pytest.mark.parametrize("name", ["bf16-sm90tc-v3", "bf16-fmaseq-v1"])
def test_expert_parallel_moe_is_the_unsharded_bits(tmp_path, name):
    """Five sequences shared out by sequence (s mod 2), eight experts four a rank: each rank's
    output rows and input gradient rows, its experts' gradients and the router's gradient
    are the unsharded MoE block's over the whole batch, bit for bit. The negative control:
    data parallelism's router gradient (each rank's own tokens, then merged) differs. A rank
    holding other than E/P experts is refused by name."""
    mp.start_processes(_ep_rank, args=(str(tmp_path / "store"), str(tmp_path), name), nprocs=WORLD,
                       start_method="fork")
    c, (a, dout, router, experts) = ops.contract(name), ep_data()
    a, router = a.clone().requires_grad_(True), router.clone().requires_grad_(True)
    experts = [tuple(w.clone().requires_grad_(True) for w in e) for e in experts]
    y = ops.moe(a, router, experts, EP_K, True, c)
    y.backward(dout)
    per = EP_E // WORLD
    for r in range(WORLD):
        got, rows = torch.load(tmp_path / f"ep{r}.pt"), rank_rows(r)
        assert torch.equal(got["y"], y.detach()[rows]), r
        assert torch.equal(got["da"], a.grad[rows]), r
        assert torch.equal(got["drouter"], router.grad), r
        for j, grads in enumerate(got["dexperts"]):
            for mine, w in zip(grads, experts[r * per + j]):
                assert torch.equal(mine, w.grad), (r, j)
        assert not torch.equal(got["dp_router"], router.grad), r
        assert "8 experts over 2 ranks: each rank holds E/P = 4 of them" in got["refused"], r


def dp_batch(vocab):
    """Five sequences of LENGTHS tokens (several grad_token_chunks together) and their loss
    coefficients, seeded."""
    g = torch.Generator().manual_seed(17)
    seqs = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in LENGTHS]
    return seqs, [torch.randn(n - 1, generator=g).tolist() for n in LENGTHS]


def dp_step(model, seqs, coefs):
    """A padded batch of seqs through a patched model and the backward of sum c_t · logprob_t:
    (each sequence's logprobs, gradients by name)."""
    ids, mask, coef = tiny_qwen3.padded_batch(seqs, coefs)
    out = model(ids, attention_mask=mask)
    (out.logprobs * coef).sum().backward()
    lp = [out.logprobs[b][out.logprob_mask[b]].detach() for b in range(len(seqs))]
    return lp, {n: p.grad for n, p in model.named_parameters()}


def _dp_rank(rank, store, out, name, path, stacked):
    import bitparity
    torch_dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD)
    try:
        load = (lambda: tiny_qwen3.stack_experts(tiny_qwen3.load(path))) if stacked else \
            (lambda: tiny_qwen3.load(path))
        seqs, coefs = dp_batch(tiny_qwen3.checkpoint_config(path)["vocab_size"])
        mine = range(rank, len(seqs), WORLD)  # sequence s on rank s mod P
        model = bitparity.patch(load(), name, dp_group=torch_dist.group.WORLD)
        lp, grads = dp_step(model, [seqs[s] for s in mine], [coefs[s] for s in mine])
        # The control: data parallelism as trainers run it, every rank the whole model on its
        # own sequences, the ranks' gradients then merged (the tree: an all-reduce's shape).
        local = dp_step(bitparity.patch(load(), name), [seqs[s] for s in mine], [coefs[s] for s in mine])[1]
        merged = {n: ops._C.rank_tree(bdist._gather(g, None)) for n, g in local.items() if g is not None}
        try:  # rank 1 holding two sequences of three: sequence s belongs on rank s mod 2
            model(torch.tensor([seqs[0][:5]] * (rank + 1)))
            refused = None
        except ValueError as e:
            refused = str(e)
        torch.save({"lp": lp, "grads": grads, "merged": merged, "refused": refused}, os.path.join(out, f"dp{rank}.pt"))
    finally:
        torch_dist.destroy_process_group()


@pytest.mark.parametrize("path,stacked",
                         [(HF_MODEL, False), (MOE_MODEL, False), (MOE_MODEL, True), (TIED_MODEL, False)],
                         ids=["dense", "moe", "moe-stacked", "tied"])
@pytest.mark.parametrize("name", ["bf16-sm90tc-v3", "bf16-fmaseq-v1"])
def test_a_data_parallel_patched_model_is_the_unsharded_bits(tmp_path, name, path, stacked):
    """bitparity.patch(model, contract, dp_group) on two ranks holding sequences s mod 2 of a
    batch of five (623 tokens, several grad_token_chunks), a MoE's experts shared out (per
    expert, or stacked as transformers 5 holds them): each rank's logprobs are those
    sequences' in the unsharded patched model over the whole batch, and every parameter's
    gradient on every rank is the whole batch's (a rank's experts: theirs). The negative
    control: each rank's own gradient merged with the other's differs. Ranks holding other
    than sequence s on rank s mod 2 are refused by name."""
    import bitparity
    mp.start_processes(_dp_rank, args=(str(tmp_path / "store"), str(tmp_path), name, path, stacked), nprocs=WORLD,
                       start_method="fork")
    model = bitparity.patch(tiny_qwen3.stack_experts(tiny_qwen3.load(path)) if stacked else tiny_qwen3.load(path),
                            name)
    seqs, coefs = dp_batch(tiny_qwen3.checkpoint_config(path)["vocab_size"])
    lp, grads = dp_step(model, seqs, coefs)
    cfg = tiny_qwen3.checkpoint_config(path)
    held = (cfg.get("num_experts") or cfg.get("num_local_experts", 0)) // WORLD
    for r in range(WORLD):
        got = torch.load(tmp_path / f"dp{r}.pt")
        for i, s in enumerate(range(r, len(seqs), WORLD)):
            assert torch.equal(got["lp"][i], lp[s]), (r, s)
        assert set(got["grads"]) == set(grads)
        for n, g in grads.items():
            mine = got["grads"][n]
            if ".experts." not in n:
                assert torch.equal(mine, g), (r, n)
            elif stacked:  # the rank's rows of the stacked experts
                assert torch.equal(mine, g[r * held:(r + 1) * held]), (r, n)
            elif r * held <= int(n.split(".experts.")[1].split(".")[0]) < (r + 1) * held:
                assert torch.equal(mine, g), (r, n)
            else:  # another rank's expert: an empty weight here
                assert mine is None, (r, n)
        assert any(not torch.equal(m, grads[n]) for n, m in got["merged"].items()), r
        assert "the ranks hold [1, 2] sequences; sequence s of the batch is on rank s mod 2" in got["refused"], r


def merged_local_grads(rows, tensors, partial, shapes, c, group):
    """The control's weight gradients: each rank's own rows reduced by the op, then the ranks'
    results merged by the tree (per-rank gradients all-reduced, as trainers run CP)."""
    mine = torch.cat([g.reshape(-1) for g in partial(*tensors)])
    tree = ops._C.rank_tree(bdist._gather(mine, group))
    sizes = [int(torch.Size(s).numel()) for s in shapes]
    return [g.view(s) for g, s in zip(tree.split(sizes), shapes)]


def cp_step(model, seqs, coefs):
    """The whole padded batch through a patched model, the backward of sum c_t · logprob_t
    over the rows it ran: (logprobs [B, S-1], their mask, gradients by name)."""
    ids, mask, coef = tiny_qwen3.padded_batch(seqs, coefs)
    out = model(ids, attention_mask=mask)
    (out.logprobs * coef).sum().backward()
    return out.logprobs.detach(), out.logprob_mask, {n: p.grad for n, p in model.named_parameters()}


def _cp_model_rank(rank, store, out, name, path, zigzag):
    import bitparity
    torch_dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD)
    try:
        seqs, coefs = dp_batch(tiny_qwen3.checkpoint_config(path)["vocab_size"])
        group = torch_dist.group.WORLD
        model = bitparity.patch(tiny_qwen3.load(path), name, cp_group=group, zigzag=zigzag)
        lp, mask, grads = cp_step(model, seqs, coefs)
        try:
            with torch.no_grad():
                model(torch.tensor([seqs[0]]), use_cache=True)
            refused = None
        except ValueError as e:
            refused = str(e)
        bdist._token_split = merged_local_grads  # this forked process only
        control = cp_step(bitparity.patch(tiny_qwen3.load(path), name, cp_group=group, zigzag=zigzag), seqs,
                          coefs)[2]
        torch.save({"lp": lp, "mask": mask, "grads": grads, "control": control, "refused": refused},
                   os.path.join(out, f"cpm{rank}.pt"))
    finally:
        torch_dist.destroy_process_group()


@pytest.mark.parametrize("path,zigzag", [(HF_MODEL, True), (MOE_MODEL, True), (TIED_MODEL, False)],
                         ids=["dense-zigzag", "moe-zigzag", "tied-contiguous"])
def test_a_context_parallel_patched_model_is_the_unsharded_bits(tmp_path, path, zigzag):
    """bitparity.patch(model, contract, cp_group) on two ranks, each given the whole batch of
    five sequences and running its zigzag (or contiguous) parts of each: the logprobs of the
    rows each rank ran are the unsharded patched model's there, the two ranks' rows together
    every row, and every parameter's gradient on every rank the whole batch's (a MoE rank's
    experts: theirs). The negative control: each rank's gradients over its own rows merged
    (the all-reduce CP trainers run) differ. A KV cache is refused by name."""
    import bitparity
    name = "bf16-sm90tc-v3"
    mp.start_processes(_cp_model_rank, args=(str(tmp_path / "store"), str(tmp_path), name, path, zigzag),
                       nprocs=WORLD, start_method="fork")
    seqs, coefs = dp_batch(tiny_qwen3.checkpoint_config(path)["vocab_size"])
    lp, mask, grads = cp_step(bitparity.patch(tiny_qwen3.load(path), name), seqs, coefs)
    cfg = tiny_qwen3.checkpoint_config(path)
    held = (cfg.get("num_experts") or cfg.get("num_local_experts", 0)) // WORLD
    got = [torch.load(tmp_path / f"cpm{r}.pt") for r in range(WORLD)]
    assert torch.equal(got[0]["mask"] ^ got[1]["mask"], mask) and not (got[0]["mask"] & got[1]["mask"]).any()
    for r, g in enumerate(got):
        assert g["mask"].any(), r
        assert torch.equal(g["lp"][g["mask"]], lp[g["mask"]]), r
        for n, whole in grads.items():
            mine = g["grads"][n]
            expert = int(n.split(".experts.")[1].split(".")[0]) if ".experts." in n else None
            if expert is not None and not r * held <= expert < (r + 1) * held:
                assert mine is None, (r, n)
            else:
                assert torch.equal(mine, whole), (r, n)
        assert any(m is not None and not torch.equal(m, grads[n]) for n, m in g["control"].items()), r
        assert "a context-parallel model runs whole sequences, without a cache" in g["refused"], r


GRIDS = {"tp2-dp2": (2, 2, 1), "tp2-cp2": (2, 1, 2), "dp2-cp2": (1, 2, 2), "tp2-dp2-cp2": (2, 2, 2)}


def _grid_rank(rank, store, out, path, grid):
    """Rank (e, c, t) of a grid of tp × dp × cp ranks, rank id (e·cp + c)·tp + t (SPEC.md
    §7): each data-parallel rank e given sequences s mod dp, cut over its CP group."""
    import bitparity
    tp, dp, cp = GRIDS[grid]
    torch_dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=tp * dp * cp)
    try:
        def at(e, c, t):
            return (e * cp + c) * tp + t
        groups = {"tp": {}, "dp": {}, "cp": {}}  # every process makes every group, in one order
        for e in range(dp):
            for c in range(cp):
                groups["tp"][e, c] = torch_dist.new_group([at(e, c, t) for t in range(tp)])
        for c in range(cp):
            for t in range(tp):
                groups["dp"][c, t] = torch_dist.new_group([at(e, c, t) for e in range(dp)])
        for e in range(dp):
            for t in range(tp):
                groups["cp"][e, t] = torch_dist.new_group([at(e, c, t) for c in range(cp)])
        (e, c), t = divmod(rank // tp, cp), rank % tp
        seqs, coefs = dp_batch(tiny_qwen3.checkpoint_config(path)["vocab_size"])
        mine = list(range(e, len(seqs), dp))
        model = bitparity.patch(tiny_qwen3.load(path), "bf16-sm90tc-v3",
                                tp_group=groups["tp"][e, c] if tp > 1 else None,
                                dp_group=groups["dp"][c, t] if dp > 1 else None,
                                cp_group=groups["cp"][e, t] if cp > 1 else None)
        lp, mask, grads = cp_step(model, [seqs[s] for s in mine], [coefs[s] for s in mine])
        torch.save({"sequences": mine, "lp": lp, "mask": mask, "grads": grads, "place": (e, c, t)},
                   os.path.join(out, f"grid{rank}.pt"))
    finally:
        torch_dist.destroy_process_group()


@pytest.mark.parametrize("path,grid", [(HF_MODEL, "tp2-dp2"), (MOE_MODEL, "tp2-dp2"), (TIED_MODEL, "tp2-cp2"),
                                       (MQA_MODEL, "tp2-cp2"), (MOE_MODEL, "dp2-cp2"), (HF_MODEL, "tp2-dp2-cp2")],
                         ids=["dense-tp2-dp2", "moe-tp2-ep2", "tied-tp2-cp2", "mqa-tp2-cp2", "moe-dp2-cp2",
                              "dense-tp2-dp2-cp2"])
def test_a_grid_patched_model_is_the_unsharded_bits(tmp_path, path, grid):
    """SPEC.md §7's grid of tp × dp × cp ranks (four or eight processes): each rank's
    logprobs are the unsharded patched model's at the positions it ran, the CP ranks of a
    sequence together run all of them, and every parameter's gradient is the rank's TP
    slice of the whole batch's (its plane's experts: theirs)."""
    import bitparity
    tp, dp, cp = GRIDS[grid]
    mp.start_processes(_grid_rank, args=(str(tmp_path / "store"), str(tmp_path), path, grid), nprocs=tp * dp * cp,
                       start_method="fork")
    c = ops.contract("bf16-sm90tc-v3")
    seqs, coefs = dp_batch(tiny_qwen3.checkpoint_config(path)["vocab_size"])
    lp, grads = dp_step(bitparity.patch(tiny_qwen3.load(path), c), seqs, coefs)
    cfg = tiny_qwen3.checkpoint_config(path)
    held = (cfg.get("num_experts") or cfg.get("num_local_experts", 0)) // (dp * cp)
    ran = {s: torch.zeros(len(seqs[s]) - 1, dtype=torch.int) for s in range(len(seqs))}
    for rank in range(tp * dp * cp):
        got = torch.load(tmp_path / f"grid{rank}.pt")
        e, cr, t = got["place"]
        for b, s in enumerate(got["sequences"]):
            pad = got["mask"].shape[1] + 1 - len(seqs[s])
            cols = got["mask"][b].nonzero().squeeze(1)
            assert torch.equal(got["lp"][b, cols], lp[s][cols - pad]), (rank, s)
            ran[s][cols - pad] += 1
        for n, whole in grads.items():
            g = got["grads"][n]
            expert = int(n.split(".experts.")[1].split(".")[0]) if ".experts." in n else None
            plane = e * cp + cr
            if expert is not None and not plane * held <= expert < (plane + 1) * held:
                assert g is None, (rank, n)
            else:
                assert torch.equal(g, tp_share(whole, n, t, path, c, g)), (rank, n)
    assert all(bool((r == tp).all()) for r in ran.values())  # each position by one CP rank, on each TP rank
