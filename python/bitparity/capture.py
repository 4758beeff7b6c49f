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

A flat-token engine (vLLM, SGLang: a map with "tokens": "flat") takes input_ids
[tokens] and positions [tokens] whose sequences only its scheduler knows, so the
caller says which sequence each token is before each forward call:

    cap.rows(seq_ids)       # one id per token (the engine's request ids), None for padding
    model(input_ids, positions)

positions are read from the call's `positions` argument (or given: cap.rows(ids,
positions)); sequences are numbered in the order their ids first appear. Ops a map
marks "rows": "sampled" (the logits an engine computes for the sampled rows only)
take the rows cap.rows(..., sampled=) names, by default the last token of each
sequence in the call; such an op that lacks some rows at write() is left out of the
dump with the logprobs computed from it, named in bitparity.not_captured, and warned
about (CaptureWarning); cap.rows_of(op) still has the rows it got.

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
import warnings

import torch

from . import dump as _dump
from . import name_maps


class CaptureError(ValueError):
    """A capture that cannot be made as asked: says what and where."""


class CaptureWarning(UserWarning):
    """A capture that leaves something out of its dump: says what and why."""


def _template_regex(template):
    return re.compile(re.escape(template).replace(re.escape("{i}"), r"(?P<i>\d+)") + r"\Z")


# An {expression} in an op's name ("layers.{i - 1}.resid_mlp").
_FIELD = re.compile(r"\{([^{}]*)\}")


def _layer_prefix(template):
    """"model.layers.{i}" of "model.layers.{i}.self_attn.rotary_emb": the module whose
    index a module shared by every layer takes from the layer running it."""
    return template[:template.index("{i}") + 3]


def _first_tensor(value, index=0):
    """The tensor itself, or element `index` of a tuple (the fused norms' (out, residual),
    the linear layers' (out, bias)); index 0 of a lone tensor is the tensor."""
    if isinstance(value, torch.Tensor) and index == 0:
        return value
    if isinstance(value, (tuple, list)) and len(value) > index and isinstance(value[index], torch.Tensor):
        return value[index]
    raise CaptureError(f"expected a tensor (or a tuple holding one at {index}), got {type(value).__name__}")


def _taken(entry, value, what):
    """The entry's tensor of a module's output: attribute `attr` of an output object
    (SGLang's LogitsProcessorOutput), then element `index` of a tuple."""
    if "attr" in entry:
        if not hasattr(value, entry["attr"]):
            raise CaptureError(f"{what}: its output {type(value).__name__} has no attribute {entry['attr']!r}")
        value = getattr(value, entry["attr"])
    try:
        return _first_tensor(value, entry.get("index", 0))
    except CaptureError as e:
        raise CaptureError(f"{what}: {e}") from None


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

    A batched call (Hugging Face's [batch, seq]) without a filled KV cache starts new
    sequences (numbered on from the capture's earlier ones); a call with one continues
    the sequences of the call that filled it, batch row by batch row. A flat call
    (vLLM's and SGLang's [tokens]) takes each token's sequence from cap.rows(), and
    its rows stay current after the call, for the logits an engine computes from the
    call's hidden states afterwards (vLLM's compute_logits)."""

    def __init__(self):
        self.call = None  # list of (seq, pos) or None per flattened (batch, seq) row
        self.batch = self.seq = 0
        self.flat = False
        self.sampled = None  # the rows of the call a "sampled" op is computed for (flat calls)
        self.group = []  # the sequence of each batch row of the running cache
        self.seen = {}  # sequence -> tokens seen so far (calls without mask or positions)
        self.tokens = {}  # (seq, pos) -> token id
        self.calls = 0
        self.count = 0  # sequences numbered so far
        self.ids = {}  # a flat engine's sequence id -> its sequence number

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
        self._start(rows, [t for row in ids for t in row], B, S, flat=False)

    def begin_flat(self, input_ids, positions, seq_ids, sampled):
        """A flat call: input_ids and positions [tokens], seq_ids one per token (None: padding)."""
        ids, pos = _flat_list(input_ids, "input_ids"), _flat_list(positions, "positions")
        seq_ids = list(seq_ids)
        if not len(ids) == len(pos) == len(seq_ids):
            raise CaptureError(f"cap.rows() gave {len(seq_ids)} sequence ids for a call of {len(ids)} input_ids and "
                               f"{len(pos)} positions: give one per token (None for padding)")
        rows, here = [], set()
        for sid, p in zip(seq_ids, pos):
            if sid is None:
                rows.append(None)
                continue
            if sid not in self.ids:
                self.ids[sid] = self._new_sequences(1)
            r = (self.ids[sid], p)
            if r in self.tokens or r in here:
                raise CaptureError(f"cap.rows(): sequence {sid!r} position {p} is run twice (a token computed again, "
                                   "as after a preemption, or a wrong sequence id): capture each token once")
            here.add(r)
            rows.append(r)
        self._start(rows, ids, 1, len(ids), flat=True)
        self.sampled = self._sampled_rows(seq_ids, sampled)

    def _sampled_rows(self, seq_ids, sampled):
        """The rows a "sampled" op is computed for: as given, else the last token of
        each run of one sequence in the call (the token an engine samples after)."""
        if sampled is not None:
            sampled = [int(k) for k in sampled]
            if any(not 0 <= k < len(self.call) or self.call[k] is None for k in sampled):
                raise CaptureError(f"cap.rows(sampled={sampled}): each must be the index of a token of the call "
                                   f"({len(self.call)} tokens), not of padding")
            return sampled
        return [k for k, sid in enumerate(seq_ids)
                if sid is not None and (k + 1 == len(seq_ids) or seq_ids[k + 1] != sid)]

    def _start(self, rows, ids, B, S, flat):
        for k, r in enumerate(rows):
            if r is not None:
                self.tokens[r] = ids[k]
                self.seen[r[0]] = max(self.seen.get(r[0], 0), r[1] + 1)
        self.call, self.batch, self.seq, self.flat, self.sampled = rows, B, S, flat, None
        self.calls += 1

    def _new_sequences(self, n):
        first, self.count = self.count, self.count + n
        self.group = list(range(first, first + n))
        return first

    def end(self):
        if not self.flat:
            self.call = None

    def keys(self, sampled, n, what):
        """The (seq, pos) of each of a recorded tensor's n rows: the call's rows, or for a
        "sampled" op its sampled rows (every row where it has as many as the call)."""
        if not sampled:
            return self.call
        if self.sampled is not None and n == len(self.sampled):
            return [self.call[k] for k in self.sampled]
        if n == len(self.call):
            return self.call
        raise CaptureError(f"{what}: {n} rows, but the call has {len(self.call)} tokens and "
                           f"{len(self.sampled or [])} sampled rows: give cap.rows(..., sampled=) the rows it is "
                           "computed for")

    def flatten(self, t, layout, what, n):
        """t as [n, features] rows of the current call."""
        B, S = self.batch, self.seq
        if layout == "bhsd":
            if t.dim() != 4 or t.shape[0] != B or t.shape[2] != S:
                raise CaptureError(f"{what}: expected [batch {B}, heads, seq {S}, dim], got {list(t.shape)}")
            return t.permute(0, 2, 1, 3).reshape(B * S, -1)
        if layout == "flat":
            if t.dim() == 0 or t.shape[0] != n:
                raise CaptureError(f"{what}: expected [tokens {n}, ...], got {list(t.shape)}")
            return t.reshape(n, -1)
        if layout == "flat_heads":  # SGLang's q/k norm input: [tokens·heads, dim], token-major
            if t.dim() != 2 or n == 0 or t.shape[0] % n:
                raise CaptureError(f"{what}: expected [tokens {n} · heads, dim], got {list(t.shape)}")
            return t.reshape(n, -1)
        if layout != "bs":
            raise CaptureError(f"{what}: layout {layout!r} is not one of bs, bhsd, flat, flat_heads")
        if t.dim() < 3 or tuple(t.shape[:2]) != (B, S):
            raise CaptureError(f"{what}: expected [batch {B}, seq {S}, ...], got {list(t.shape)}")
        return t.reshape(B * S, -1)


def _flat_list(t, what):
    if not isinstance(t, torch.Tensor) or t.dim() != 1:
        raise CaptureError(f"a flat-token model's forward call needs {what} [tokens], got "
                           f"{list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    return t.tolist()


class Capture:
    def __init__(self, model, name_map=None, temperature=1.0, tp=None):
        self.model = model
        self.map = name_map if name_map is not None else name_maps.for_model(model)
        self.temperature = float(temperature)
        self.rank, self.world = tp if tp is not None else (0, 1)
        if not 0 <= self.rank < self.world:
            raise CaptureError(f"tp=(rank, world) = {tp}: the rank must be in [0, world)")
        tokens = self.map.get("tokens", "batched")
        if tokens not in ("batched", "flat"):
            raise CaptureError(f"name map {self.map.get('name')}: \"tokens\" is {tokens!r}, not batched or flat")
        self._flat = tokens == "flat"
        self._sizes = _size_names(model, self.world)
        self._shards = {}  # tensor -> the dimension this rank holds a slice of (world > 1)
        self._rows = _Rows()
        self._pending = None  # cap.rows() of the next flat call
        self._ops = {}  # op -> {(seq, pos): row tensor}
        self._order = []  # ops in the order first seen (execution order)
        self._sampled = set()  # ops computed for an engine's sampled rows
        self._silent = set()  # hooked modules that have not run yet
        self._undo = []
        self._tracked = set()  # templates whose modules say which layer index runs
        self._inside = []  # (template, layer index) of each such module running, innermost last

    def rows(self, seq_ids, positions=None, sampled=None):
        """Says which sequence each token of the next forward call is (flat-token maps):
        seq_ids one per token, any hashable id (the engine's request ids; None for a
        padding token), sequences numbered in the order their ids first appear.
        positions: each token's position, by default the call's `positions` argument.
        sampled: the indices of the call's tokens whose logits the engine computes,
        by default the last token of each run of one sequence in the call."""
        if not self._flat:
            raise CaptureError(f"name map {self.map.get('name')}: cap.rows() is for flat-token maps (\"tokens\": "
                               "\"flat\"); this map reads the rows of its batched calls from their arguments")
        seq_ids = seq_ids.tolist() if isinstance(seq_ids, torch.Tensor) else list(seq_ids)
        if positions is not None and not isinstance(positions, torch.Tensor):
            positions = torch.tensor(list(positions))
        self._pending = (seq_ids, positions, sampled)

    # --- hooks ------------------------------------------------------------------

    def _record(self, op, value, layout, what, sampled):
        if self._rows.call is None:
            raise CaptureError(f"{what} ran outside a forward call of the captured model")
        value = value.detach()
        keys = self._rows.keys(sampled, value.shape[0] if value.dim() else 0, what)
        # One copy of the call's rows (engines overwrite their outputs in place: fused
        # norms, RoPE), shared by the rows' views, rather than a copy a row; a layout whose
        # flattening copied already (bhsd) is not copied again.
        flat = self._rows.flatten(value, layout, what, len(keys))
        rows = (flat.clone() if flat.data_ptr() == value.data_ptr() else flat).unbind(0)
        store = self._ops.get(op)
        if store is None:
            store = self._ops[op] = {}
            self._order.append(op)
        if sampled:
            self._sampled.add(op)
        for key, row in zip(keys, rows):
            if key is None:
                continue
            if key in store:
                raise CaptureError(f"ops.{op}: sequence {key[0]} position {key[1]} captured twice (the same token "
                                   "run twice in one capture: capture each run on its own)")
            store[key] = row

    def _modules(self, template):
        """(path, module, layer index) of every path matching template; a module reached
        by several paths (one rotary_emb shared by every layer) once per path."""
        pattern = _template_regex(template)
        for name, module in self.model.named_modules(remove_duplicate=False):
            m = pattern.match(name)
            if m:
                yield name, module, m.groupdict().get("i")

    def _op_names(self, entry, i):
        """The entry's op names at layer i: each {expression} of i, the config's
        integers and world evaluated ("layers.{i - 1}.resid_mlp"); None where one is
        negative, as layer i - 1 of layer 0: that module yields no op there. Evaluated
        once, when the hooks are placed: they depend on the map, the config and world."""
        ops = entry["op"] if isinstance(entry["op"], list) else [entry["op"]]
        names = self._sizes if i is None else dict(self._sizes, i=int(i))
        values = []

        def field(m):
            values.append(self._size(m.group(1), entry, names))
            return str(values[-1])
        ops = [_FIELD.sub(field, op) for op in ops]
        return None if any(v < 0 for v in values) else ops

    def _split_sizes(self, entry):
        """The feature sizes an entry splits its tensor into, or None."""
        return [self._size(x, entry) for x in entry["split"]] if "split" in entry else None

    def _record_entry(self, entry, ops, sizes, value, what):
        """Records a module's or function's tensor under the entry's op(s): split along
        its features into `sizes` (_split_sizes) where the entry names them, its shard
        dimension noted."""
        layout = entry.get("layout", "flat" if self._flat else "bs")
        parts = [value]
        if sizes is not None:
            if value.shape[-1] != sum(sizes):
                raise CaptureError(f"{what}: {value.shape[-1]} features, but the map splits {sum(sizes)} ({sizes})")
            parts = list(torch.split(value, sizes, dim=-1))
        elif len(ops) > 1:
            raise CaptureError(f"name map: {what} yields {len(ops)} ops from one tensor without a split")
        for op, part in zip(ops, parts):
            self._record(op, part, layout, what, entry.get("rows") == "sampled")
            if self.world > 1 and "shard" in entry:
                self._shards["ops." + op] = 1  # [tokens, features]: the features are sharded

    def _size(self, expression, entry, names=None):
        return _sized(expression, entry.get("module") or entry.get("function"), self._sizes if names is None else names)

    def _hook_module(self, entry):
        places = {}  # id(module) -> (module, {layer index: path})
        for name, module, i in self._modules(entry["module"]):
            places.setdefault(id(module), (module, {}))[1][i] = name
        sizes = self._split_sizes(entry)
        for module, at in places.values():
            self._silent.update(at.values())
            where = self._where(entry["module"], at)
            names = {i: self._op_names(entry, i) for i in at}
            if entry.get("take", "output") == "input":
                def pre(mod, args, where=where, names=names):
                    self._hooked(entry, where, names, sizes, lambda name: _first_tensor(args), " (input)")
                self._undo.append(module.register_forward_pre_hook(pre).remove)
            else:
                def post(mod, args, out, where=where, names=names):
                    self._hooked(entry, where, names, sizes, lambda name: _taken(entry, out, name), "")
                self._undo.append(module.register_forward_hook(post).remove)
        return bool(places)

    def _hooked(self, entry, where, names, sizes, take, suffix):
        """A hooked module ran: its entry's tensor, take(path), recorded, but only where
        the entry yields ops (layer 0's norm has no residual output to take)."""
        i, name = where()
        self._silent.discard(name)
        if names[i] is not None:
            self._record_entry(entry, names[i], sizes, take(name), name + suffix)

    def _where(self, template, at):
        """How a hook finds its module's layer index and path: the one path reaching it,
        or, for a module that several layers share (vLLM's and SGLang's get_rope give
        every layer one rotary_emb), the layer running it."""
        if len(at) == 1:
            fixed = next(iter(at.items()))
            return lambda: fixed
        prefix = _layer_prefix(template)
        self._track(prefix)

        def current():
            i = self._current(prefix)
            if i not in at:
                raise CaptureError(f"{template}: a module shared by layers {sorted(map(int, at))} ran outside them")
            return i, at[i]
        return current

    def _track(self, template):
        """While a module of template runs, notes which layer index it is."""
        if template in self._tracked:
            return
        self._tracked.add(template)
        for _, module, i in self._modules(template):
            def enter(mod, args, i=i):
                self._inside.append((template, i))

            def leave(mod, args, out):
                self._inside.pop()
            self._undo.append(module.register_forward_pre_hook(enter).remove)
            self._undo.append(module.register_forward_hook(leave).remove)

    def _current(self, template):
        return next((i for t, i in reversed(self._inside) if t == template), None)

    def _hook_function(self, entry):
        owners = list(self._modules(entry["of"]))
        if not owners:
            return False
        fn_name = entry["function"]
        names = {i: self._op_names(entry, i) for _, _, i in owners}
        sizes = self._split_sizes(entry)
        namespaces = {id(sys.modules[type(m).__module__].__dict__): sys.modules[type(m).__module__].__dict__
                      for _, m, _ in owners}
        for ns in namespaces.values():
            original = ns.get(fn_name)
            if original is None:
                raise CaptureError(f"name map: {entry['of']}'s module has no function {fn_name}")

            def wrapper(*args, _original=original, **kwargs):
                out = _original(*args, **kwargs)
                i = self._current(entry["of"])
                for op, t in zip(names.get(i) or (), out):
                    self._record_entry(entry, [op], sizes, t, f"{fn_name} of layer {i}")
                return out
            ns[fn_name] = wrapper
            self._undo.append(lambda ns=ns, original=original: ns.__setitem__(fn_name, original))
        self._track(entry["of"])
        return True

    def _wrap_forward(self):
        model, original = self.model, self.model.forward

        def forward(*args, **kwargs):
            self._inside.clear()  # a call that raised left its modules' marks
            if self._flat:
                self._begin_flat(args, kwargs)
            else:
                cached = _cache_length(kwargs.get("past_key_values")) > 0
                self._rows.begin(kwargs.get("input_ids", args[0] if args else None), kwargs.get("attention_mask"),
                                 kwargs.get("position_ids"), cached)
            try:
                return original(*args, **kwargs)
            finally:
                self._rows.end()
        model.forward = forward
        self._undo.append(lambda: delattr(model, "forward"))

    def _begin_flat(self, args, kwargs):
        """A flat call's rows: its input_ids and positions, each token's sequence from cap.rows()."""
        pending, self._pending = self._pending, None
        if pending is None:
            raise CaptureError(f"name map {self.map.get('name')}: a forward call of {type(self.model).__name__} "
                               "without cap.rows(seq_ids) before it: a flat-token engine's scheduler alone knows "
                               "which sequence each token is; say it before every forward call")
        seq_ids, positions, sampled = pending
        if positions is None:
            positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        self._rows.begin_flat(kwargs.get("input_ids", args[0] if args else None), positions, seq_ids, sampled)

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
        k_proj), then any op of the map that bitparity does not name, as first seen.
        A "sampled" op that lacks rows (the logits of an engine's sampled rows) is left
        out, and so is a module that never ran: each with a CaptureWarning."""
        self.sequences()  # every sequence whole, from its first token
        keys = self._keys()
        incomplete = self._incomplete()
        self._warn_left_out(incomplete, len(keys))
        out = {}
        for op in sorted(self._order, key=lambda op: _op_rank(op, self._order)):
            if op in incomplete:
                continue
            store = self._ops[op]
            missing = [k for k in keys if k not in store]
            if missing:
                raise CaptureError(f"ops.{op}: no row for sequence {missing[0][0]} position {missing[0][1]}")
            out["ops." + op] = torch.stack([store[k] for k in keys])
        return out

    def _warn_left_out(self, incomplete, total):
        """Says what the dump lacks: the ops of some sampled rows only, the modules that never ran."""
        for op, n in incomplete.items():
            also = " with the logprobs and entropy computed from it" if op == "logits" else ""
            warnings.warn(f"ops.{op}: computed for {n} of the capture's {total} rows only (the engine's sampled rows): "
                          f"left out of the dump{also}, named in bitparity.not_captured (cap.rows_of({op!r}) has "
                          "them); to capture it whole, compute it for every token and say so with "
                          "cap.rows(..., sampled=)", CaptureWarning, stacklevel=3)
        if self._silent and self._rows.calls:
            silent = sorted(self._silent)
            warnings.warn(f"name map {self.map.get('name')}: {len(silent)} module(s) it places never ran, so their ops "
                          f"are not in the dump: {', '.join(silent[:4])}{' ...' if len(silent) > 4 else ''} (a fused "
                          "kernel, a CUDA graph or torch.compile ran the op without calling the module)",
                          CaptureWarning, stacklevel=3)

    def rows_of(self, op):
        """{(sequence, position): row} of every row captured of `op`, whole or not: the
        logits of an engine's sampled rows, which the dump leaves out, are here."""
        if op not in self._ops:
            raise CaptureError(f"ops.{op} was not captured (captured: {', '.join(self._order)})")
        return dict(self._ops[op])

    def _incomplete(self):
        """{op: how many rows it has} of the "sampled" ops that lack some of the capture's rows."""
        total = len(self._rows.tokens)
        return {op: len(self._ops[op]) for op in sorted(self._sampled) if len(self._ops[op]) < total}

    def logprobs(self):
        """{"logprobs.<s>", "entropy.<s>"}: fp32, of token t+1 at position t; none where
        the logits are of sampled rows only (ops() warns)."""
        if "logits" not in self._ops:
            raise CaptureError("no logits were captured: the name map places no op \"logits\"")
        if "logits" in self._incomplete():
            return {}
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
        """named_gradients of the captured model under this capture's map and world; the
        sharded ones are recorded for the dump's metadata."""
        out, shards = named_gradients(self.model, self.map, self.world)
        self._shards.update(shards)
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
        not_captured = list(self.map.get("not_captured", []))
        not_captured += [op for op in self._incomplete() if op not in not_captured]
        if not_captured:
            m["bitparity.not_captured"] = json.dumps(not_captured)
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


def named_gradients(model, name_map=None, world=1):
    """({"grads.<name>": fp32} of every parameter of `model` that has a gradient, under its
    Hugging Face name; {that key: dimension} of those a rank holds a slice of, world > 1).
    The map's grads rules (name_map, else the built-in map of the model's class) rename,
    split fused parameters (qkv_proj into q/k/v_proj; stacked experts, "per_expert", expert
    by expert) and say which are sharded."""
    name_map = name_map if name_map is not None else name_maps.for_model(model)
    rules, sizes = name_map.get("grads", {}), _size_names(model, world)
    rename = [(re.compile(a), b) for a, b in rules.get("rename", [])]
    splits = [(re.compile(r["param"]), r) for r in rules.get("split", [])]
    shard_rules = [(re.compile(a), d) for a, d in rules.get("shard", [])]
    out, shards = {}, {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        for pattern, repl in rename:
            name = pattern.sub(repl, name)
        grad = p.grad.detach().float()
        pieces = {name: grad}
        for pattern, rule in splits:
            m = pattern.fullmatch(name)
            if m:
                pieces = _split_grad(name, grad, m, rule, sizes)
                break
        for n, t in pieces.items():
            out["grads." + n] = t.contiguous()
            for pattern, dim in shard_rules:
                if world > 1 and pattern.fullmatch(n):
                    shards["grads." + n] = dim
                    break
    return out, shards


def _split_grad(name, grad, m, rule, sizes):
    """A fused parameter's gradient cut into Hugging Face's parameters; a "per_expert"
    one (stacked experts [E, ...]) first cut into its experts, {e} in the names their index."""
    cut = [_sized(x, name, sizes) for x in rule["sizes"]]
    dim = rule.get("dim", 0)
    stacked = list(enumerate(grad)) if rule.get("per_expert") else [(None, grad)]
    pieces = {}
    for e, g in stacked:
        if g.shape[dim] != sum(cut):
            raise CaptureError(f"grads.{name}: {g.shape[dim]} rows along {dim}, the map splits {cut}")
        for n, t in zip(rule["into"], torch.split(g, cut, dim=dim)):
            pieces[m.expand(n).replace("{e}", str(e))] = t
    return pieces


def _sized(expression, where, names):
    """A map's size expression evaluated over `names`; CaptureError naming the entry at `where`."""
    try:
        return int(_evaluate(expression, names))
    except (ValueError, KeyError, ZeroDivisionError, SyntaxError) as e:
        raise CaptureError(f"name map: {expression!r} in the entry of {where}: {e!r} (names: {sorted(names)})") from None


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
