"""bitparity.capture: record a PyTorch engine's ops under bitparity's names.

    with bitparity.capture(model) as cap:
        logits = model(input_ids, attention_mask=mask).logits
    cap.write("engine.safetensors")

Every op the name map places (name_maps.py) is recorded as `ops.<op>`, [tokens,
features], rows in bitparity's canonical order: sequence by sequence in batch order,
positions increasing (SPEC.md §6.3), whatever the engine's batch looked like. Which
row is which comes from each forward call's arguments:

- `attention_mask` [batch, past + seq] (left or right padding): a row is a token where
  the mask is 1, its position the count of 1s before it; padding rows are dropped;
- packed sequences: one batch row whose `position_ids` restart at 0 for each sequence;
- neither: positions continue from the tokens this capture saw before for that batch
  row (extend, then KV-cache decoding one token a step).

Sequence s is batch row s (padded and decoding calls) or the s-th packed segment.
The logprob and entropy of each next token are computed from the captured logits in
fp32 (torch.log_softmax of logits.float() / temperature), as trainers commonly do;
`gradients()` after backward() adds every parameter's gradient under its Hugging
Face name (`grads.<name>`, fp32).
"""

import ast
import hashlib
import json
import re
import sys

import torch

from . import dump as _dump
from . import name_maps


class CaptureError(ValueError):
    """A capture that cannot be made as asked: says what and where."""


def _template_regex(template):
    return re.compile(re.escape(template).replace(re.escape("{i}"), r"(?P<i>\d+)") + r"\Z")


def _first_tensor(value, index=0):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and len(value) > index and isinstance(value[index], torch.Tensor):
        return value[index]
    raise CaptureError(f"expected a tensor (or a tuple holding one at {index}), got {type(value).__name__}")


def _cache_length(past_key_values):
    """Tokens already in a KV cache: a Hugging Face Cache, or a list of per-layer (k, v)."""
    if past_key_values is None:
        return 0
    if hasattr(past_key_values, "get_seq_length"):
        return int(past_key_values.get_seq_length())
    if isinstance(past_key_values, (list, tuple)) and past_key_values:
        return int(past_key_values[0][0].shape[-2])
    return 0


class _Rows:
    """Which (sequence, position) each row of the current forward call is.

    A call without a filled KV cache starts new sequences (numbered on from the
    capture's earlier ones); a call with one continues the sequences of the call
    that filled it, batch row by batch row."""

    def __init__(self):
        self.call = None  # list of (seq, pos) or None per flattened (batch, seq) row
        self.batch = self.seq = 0
        self.group = []  # the sequence of each batch row of the running cache
        self.seen = {}  # sequence -> tokens seen so far (calls without mask or positions)
        self.tokens = {}  # (seq, pos) -> token id
        self.calls = 0

    def begin(self, input_ids, attention_mask, position_ids, cached):
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise CaptureError("capture needs input_ids [batch, seq] in every forward call")
        B, S = input_ids.shape
        ids = input_ids.tolist()
        packed = (not cached and position_ids is not None and B == 1 and S > 1
                  and 0 in position_ids[0, 1:].tolist())
        if packed:
            starts = position_ids[0].tolist()
            rows, seq = [], self._new_sequences(starts.count(0)) - 1
            for p in starts:
                seq += p == 0
                rows.append((seq, p))
        else:
            if cached and len(self.group) != B:
                raise CaptureError(f"a call with a KV cache has {B} batch rows; the call that filled the cache had "
                                   f"{len(self.group)}")
            if not cached:
                self._new_sequences(B)
            rows = [None] * (B * S)
            if attention_mask is not None:
                mask = attention_mask.tolist()
                past = len(mask[0]) - S
                if attention_mask.dim() != 2 or past < 0:
                    raise CaptureError(f"attention_mask {list(attention_mask.shape)} does not cover input_ids "
                                       f"{[B, S]}")
                for b in range(B):
                    before = sum(1 for m in mask[b][:past] if m)
                    for j in range(S):
                        if mask[b][past + j]:
                            rows[b * S + j] = (self.group[b], before)
                            before += 1
            elif position_ids is not None:
                pos = position_ids.expand(B, S).tolist()
                rows = [(self.group[b], pos[b][j]) for b in range(B) for j in range(S)]
            else:
                rows = [(self.group[b], self.seen.get(self.group[b], 0) + j) for b in range(B) for j in range(S)]
        for k, r in enumerate(rows):
            if r is not None:
                self.tokens[r] = ids[k // S][k % S]
                self.seen[r[0]] = max(self.seen.get(r[0], 0), r[1] + 1)
        self.call, self.batch, self.seq = rows, B, S
        self.calls += 1

    def _new_sequences(self, n):
        first = 1 + max((s for s, _ in self.tokens), default=-1)
        self.group = list(range(first, first + n))
        return first

    def end(self):
        self.call = None

    def flatten(self, t, layout, what):
        """t as [batch·seq, features] rows of the current call."""
        B, S = self.batch, self.seq
        if layout == "bhsd":
            if t.dim() != 4 or t.shape[0] != B or t.shape[2] != S:
                raise CaptureError(f"{what}: expected [batch {B}, heads, seq {S}, dim], got {list(t.shape)}")
            return t.permute(0, 2, 1, 3).reshape(B * S, -1)
        if layout == "flat":
            if t.shape[0] != B * S:
                raise CaptureError(f"{what}: expected [batch·seq {B * S}, ...], got {list(t.shape)}")
            return t.reshape(B * S, -1)
        if t.dim() < 3 or tuple(t.shape[:2]) != (B, S):
            raise CaptureError(f"{what}: expected [batch {B}, seq {S}, ...], got {list(t.shape)}")
        return t.reshape(B * S, -1)


class Capture:
    def __init__(self, model, name_map=None, temperature=1.0, tp=None):
        self.model = model
        self.map = name_map if name_map is not None else name_maps.for_model(model)
        self.temperature = float(temperature)
        self.rank, self.world = tp if tp is not None else (0, 1)
        if not 0 <= self.rank < self.world:
            raise CaptureError(f"tp=(rank, world) = {tp}: the rank must be in [0, world)")
        self._sizes = _size_names(model, self.world)
        self._shards = {}  # tensor -> the dimension this rank holds a slice of (world > 1)
        self._rows = _Rows()
        self._ops = {}  # op -> {(seq, pos): row tensor}
        self._order = []  # ops in the order first seen (execution order)
        self._undo = []
        self._layer = None  # the layer index of the module executing, for function entries

    # --- hooks ------------------------------------------------------------------

    def _record(self, op, value, layout, what):
        if self._rows.call is None:
            raise CaptureError(f"{what} ran outside a forward call of the captured model")
        rows = self._rows.flatten(value.detach(), layout, what)
        store = self._ops.get(op)
        if store is None:
            store = self._ops[op] = {}
            self._order.append(op)
        for k, key in enumerate(self._rows.call):
            if key is None:
                continue
            if key in store:
                raise CaptureError(f"ops.{op}: sequence {key[0]} position {key[1]} captured twice (the same token "
                                   "run twice in one capture: capture each run on its own)")
            store[key] = rows[k].clone()

    def _modules(self, template):
        pattern = _template_regex(template)
        for name, module in self.model.named_modules():
            m = pattern.match(name)
            if m:
                yield name, module, m.groupdict().get("i")

    def _record_entry(self, entry, i, value, what):
        """Records a module's or function's tensor under the entry's op(s): split along
        its features where the entry names sizes, its shard dimension noted."""
        ops = entry["op"] if isinstance(entry["op"], list) else [entry["op"]]
        layout = entry.get("layout", "bs")
        parts = [value]
        if "split" in entry:
            sizes = [self._size(x, entry) for x in entry["split"]]
            if value.shape[-1] != sum(sizes):
                raise CaptureError(f"{what}: {value.shape[-1]} features, but the map splits {sum(sizes)} ({sizes})")
            parts = list(torch.split(value, sizes, dim=-1))
        elif len(ops) > 1:
            raise CaptureError(f"name map: {what} yields {len(ops)} ops from one tensor without a split")
        for op, part in zip(ops, parts):
            op = op.format(i=i)
            self._record(op, part, layout, what)
            if self.world > 1 and "shard" in entry:
                self._shards["ops." + op] = 1  # [tokens, features]: the features are sharded

    def _size(self, expression, entry):
        try:
            return int(_evaluate(expression, self._sizes))
        except (ValueError, KeyError, ZeroDivisionError) as e:
            raise CaptureError(f"name map: split size {expression!r} of {entry.get('module') or entry.get('function')}: "
                               f"{e} (names: {sorted(self._sizes)})") from None

    def _hook_module(self, entry):
        found = False
        take, index = entry.get("take", "output"), entry.get("index", 0)
        for name, module, i in self._modules(entry["module"]):
            found = True
            if take == "input":
                def pre(mod, args, i=i, name=name):
                    self._record_entry(entry, i, _first_tensor(args), f"{name} (input)")
                self._undo.append(module.register_forward_pre_hook(pre).remove)
            else:
                def post(mod, args, out, i=i, name=name):
                    self._record_entry(entry, i, _first_tensor(out, index), name)
                self._undo.append(module.register_forward_hook(post).remove)
        return found

    def _hook_function(self, entry):
        owners = list(self._modules(entry["of"]))
        if not owners:
            return False
        fn_name, ops = entry["function"], entry["op"]
        namespaces = {id(sys.modules[type(m).__module__].__dict__): sys.modules[type(m).__module__].__dict__
                      for _, m, _ in owners}
        for ns in namespaces.values():
            original = ns.get(fn_name)
            if original is None:
                raise CaptureError(f"name map: {entry['of']}'s module has no function {fn_name}")

            def wrapper(*args, _original=original, **kwargs):
                out = _original(*args, **kwargs)
                if self._layer is not None:
                    for op, t in zip(ops, out):
                        self._record_entry(dict(entry, op=op), self._layer, t, f"{fn_name} of layer {self._layer}")
                return out
            ns[fn_name] = wrapper
            self._undo.append(lambda ns=ns, original=original: ns.__setitem__(fn_name, original))
        for _, module, i in owners:
            def enter(mod, args, i=i):
                self._layer = i

            def leave(mod, args, out):
                self._layer = None
            self._undo.append(module.register_forward_pre_hook(enter).remove)
            self._undo.append(module.register_forward_hook(leave).remove)
        return True

    def _wrap_forward(self):
        model, original = self.model, self.model.forward

        def forward(*args, **kwargs):
            input_ids = kwargs.get("input_ids", args[0] if args else None)
            cached = _cache_length(kwargs.get("past_key_values")) > 0
            self._rows.begin(input_ids, kwargs.get("attention_mask"), kwargs.get("position_ids"), cached)
            try:
                return original(*args, **kwargs)
            finally:
                self._rows.end()
        model.forward = forward
        self._undo.append(lambda: delattr(model, "forward"))

    def __enter__(self):
        try:
            self._wrap_forward()
            matched = [self._hook_function(e) if "function" in e else self._hook_module(e) for e in self.map["ops"]]
            if not any(matched):
                raise CaptureError(f"name map {self.map.get('name')}: no entry matches a module of "
                                   f"{type(self.model).__name__}")
            for entry, found in zip(self.map["ops"], matched):
                if not found and entry.get("required", False):
                    raise CaptureError(f"name map {self.map.get('name')}: no module matches "
                                       f"{entry.get('module') or entry.get('of')}")
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, *exc):
        self._remove()
        return False

    def _remove(self):
        while self._undo:
            self._undo.pop()()

    # --- results ----------------------------------------------------------------

    def _keys(self):
        return sorted(self._rows.tokens)

    def _sequence_ids(self):
        return sorted({s for s, _ in self._rows.tokens})

    def sequences(self):
        """The token ids of each captured sequence, in canonical order."""
        seqs = {}
        for (s, p) in self._keys():
            toks = seqs.setdefault(s, [])
            if p != len(toks):
                raise CaptureError(f"sequence {s}: position {len(toks)} was never captured (capture every token "
                                   "from the sequence's first)")
            toks.append(self._rows.tokens[(s, p)])
        return [seqs[s] for s in self._sequence_ids()]

    def ops(self):
        """{"ops.<op>": [tokens, features]}: rows in canonical order, ops in bitparity's
        execution order (SPEC.md §6.3; an engine may run them in another, q_norm before
        k_proj), then any op of the map that bitparity does not name, as first seen."""
        self.sequences()  # every sequence whole, from its first token
        keys = self._keys()
        out = {}
        for op in sorted(self._order, key=lambda op: _op_rank(op, self._order)):
            store = self._ops[op]
            missing = [k for k in keys if k not in store]
            if missing:
                raise CaptureError(f"ops.{op}: no row for sequence {missing[0][0]} position {missing[0][1]}")
            out["ops." + op] = torch.stack([store[k] for k in keys])
        return out

    def logprobs(self):
        """{"logprobs.<s>", "entropy.<s>"}: fp32, of token t+1 at position t."""
        if "logits" not in self._ops:
            raise CaptureError("no logits were captured: the name map places no op \"logits\"")
        store, out = self._ops["logits"], {}
        for n, (s, toks) in enumerate(zip(self._sequence_ids(), self.sequences())):
            rows = [store[(s, p)] for p in range(len(toks) - 1)]
            if not rows:
                out[f"logprobs.{n}"] = out[f"entropy.{n}"] = torch.zeros(0)
                continue
            logp = torch.log_softmax(torch.stack(rows).float() / self.temperature, dim=-1)
            out[f"logprobs.{n}"] = logp.gather(1, torch.tensor(toks[1:], device=logp.device).unsqueeze(1)).squeeze(1)
            out[f"entropy.{n}"] = -(logp.exp() * logp).sum(dim=-1)
        return out

    def gradients(self):
        """{"grads.<name>": fp32} of every parameter that has a gradient, under its
        Hugging Face name: the map's grads rules rename, split fused parameters
        (qkv_proj into q/k/v_proj) and say which are sharded (world > 1)."""
        rules = self.map.get("grads", {})
        rename = [(re.compile(a), b) for a, b in rules.get("rename", [])]
        splits = [(re.compile(r["param"]), r) for r in rules.get("split", [])]
        shards = [(re.compile(a), d) for a, d in rules.get("shard", [])]
        out = {}
        for name, p in self.model.named_parameters():
            if p.grad is None:
                continue
            for pattern, repl in rename:
                name = pattern.sub(repl, name)
            grad = p.grad.detach().float()
            pieces = {name: grad}
            for pattern, rule in splits:
                m = pattern.fullmatch(name)
                if m:
                    sizes = [self._size(x, {"module": name}) for x in rule["sizes"]]
                    dim = rule.get("dim", 0)
                    if grad.shape[dim] != sum(sizes):
                        raise CaptureError(f"grads.{name}: {grad.shape[dim]} rows along {dim}, the map splits {sizes}")
                    pieces = {m.expand(n): t for n, t in zip(rule["into"], torch.split(grad, sizes, dim=dim))}
                    break
            for n, t in pieces.items():
                out["grads." + n] = t.contiguous()
                for pattern, dim in shards:
                    if self.world > 1 and pattern.fullmatch(n):
                        self._shards["grads." + n] = dim
                        break
        return out

    def tensors(self):
        t = self.ops()
        t.update(self.logprobs())
        t.update(self.gradients())
        return t

    def metadata(self, coefficients=None, weights=None):
        tokens = {"sequences": self.sequences()}
        if coefficients is not None:
            tokens["coefficients"] = [[float(c) for c in row] for row in coefficients]
        m = {
            "bitparity.capture": "ops",
            "bitparity.engine": f"{type(self.model).__name__} (torch {torch.__version__})",
            "bitparity.name_map": str(self.map.get("name", "custom")),
            "bitparity.tokens": json.dumps(tokens, separators=(",", ":")),
            "bitparity.temperature": repr(self.temperature),
            "bitparity.calls": str(self._rows.calls),
            "bitparity.weights": weights or _parameters_digest(self.model),
        }
        if self.map.get("not_captured"):
            m["bitparity.not_captured"] = json.dumps(list(self.map["not_captured"]))
        if self.world > 1:
            m["bitparity.rank"], m["bitparity.world"] = str(self.rank), str(self.world)
            m["bitparity.shards"] = json.dumps(self._shards, sort_keys=True, separators=(",", ":"))
        config = getattr(self.model, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            m["bitparity.config"] = json.dumps(config.to_dict(), default=str, sort_keys=True)
        return m

    def write(self, path, coefficients=None, weights=None):
        """Writes the dump: ops, logprobs, entropy, gradients (if any) and the metadata
        from which `bitparity run` reproduces the case (the tokens as a tokens file)."""
        tensors = self.tensors()  # first: it notes which tensors are sharded
        _dump.write_dump(path, tensors, self.metadata(coefficients, weights))


# bitparity's ops in execution order (SPEC.md §6.3).
_LAYER_OPS = ["input_norm", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "q_rope", "k_rope", "attn", "attn_out",
              "resid_attn", "post_norm", "mlp_gate", "mlp_up", "mlp_act", "router_logits", "router_weights",
              "expert_out", "mlp_out", "resid_mlp"]
_LAYER_OP = re.compile(r"layers\.(\d+)\.(\w+)\Z")


def _op_rank(op, first_seen):
    if op == "embed":
        return (0, 0, 0)
    m = _LAYER_OP.match(op)
    if m and m.group(2) in _LAYER_OPS:
        return (1, int(m.group(1)), _LAYER_OPS.index(m.group(2)))
    if op in ("final_norm", "logits"):
        return (2, 0, ("final_norm", "logits").index(op))
    return (3, 0, first_seen.index(op))


def _size_names(model, world):
    """The names a split size may use: the model config's integers, and world."""
    names = {"world": world}
    config = getattr(model, "config", None)
    if config is not None:
        items = config.to_dict().items() if hasattr(config, "to_dict") else vars(config).items()
        names.update({k: v for k, v in items if isinstance(v, int) and not isinstance(v, bool)})
    return names


def _evaluate(expression, names):
    """An integer expression over `names`: + - * // and parentheses, nothing else."""
    if isinstance(expression, int):
        return expression
    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.FloorDiv: lambda a, b: a // b}

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"not an integer expression of names: {ast.dump(node)}")
    return ev(ast.parse(str(expression), mode="eval"))


def _parameters_digest(model):
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(_dump._bytes_of(p))
    return "in-memory parameters sha256 " + h.hexdigest()


def capture(model, name_map=None, temperature=1.0, tp=None):
    """A context manager recording `model`'s ops (see the module's docstring).
    tp=(rank, world): this process holds rank `rank` of a tensor-parallel group of
    `world`; its dump says so, and which tensors the map shards, for `bitparity merge`."""
    return Capture(model, name_map=name_map, temperature=temperature, tp=tp)
