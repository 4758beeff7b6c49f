#!/usr/bin/env python3
"""Count the SASS instructions of each softmax exponential in a kernel listing
(issue 19: exp2_poly in the attention inner loop, target <= 16 per score).

  sass_exp_count.py section CUBIN NAME > k.bin   raw code of the one .text section
                                                 whose name contains NAME (for
                                                 `nvdisasm -b SM90 k.bin`, which
                                                 reads any cubin's code)
  sass_exp_count.py count LISTING                per-score counts of a listing
                                                 (nvdisasm or cuobjdump -sass)

count: the listing must be one kernel's straight-line code. Each exp2_poly ends in
its canonical-NaN select (`SEL Rd, Ry, 0x7fc00000`, or `FSEL Rd, Ry, +QNAN` where
the NaN test is a float compare); from there the backward slice
follows the registers and predicates read, back to the exponent-forming fma
(`FFMA Rt, Rz, c, -Rm`: t = fma(z, c, -m_c), SPEC.md §5.6 v2), where it stops. A
predicated definition does not end a live range (the value it may keep is traced
too), so the slice also holds the absent slot's -Inf default. Instructions in more
than one slice (hoisted constants) are counted apart. Exit status 1 if the slices
differ in size, 2 for bad input (no exponential found, no such section).
"""
import re
import struct
import sys


def bad_input(message):
    print(message, file=sys.stderr)
    sys.exit(2)
from collections import Counter

LINE = re.compile(r'\s*/\*([0-9a-f]+)\*/\s+(@!?P\d\s+)?([A-Z0-9_.]+)\s*(.*?)\s*;')
EXPONENT_FMA = re.compile(r'R\d+, R\d+, \S+, -R\d+')


def section(path, name):
    data = open(path, 'rb').read()
    shoff, = struct.unpack_from('<Q', data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', data, 0x3A)
    headers = [struct.unpack_from('<IIQQQQIIQQ', data, shoff + i * shentsize) for i in range(shnum)]
    strings = headers[shstrndx][4]

    def name_of(h):
        start = strings + h[0]
        return data[start:data.index(b'\0', start)].decode()

    hits = [h for h in headers if name_of(h).startswith('.text.') and name in name_of(h)]
    if len(hits) != 1:
        bad_input(f'{len(hits)} .text sections match {name!r}: name exactly one')
    sys.stdout.buffer.write(data[hits[0][4]:hits[0][4] + hits[0][5]])


def registers(text):
    return set(re.findall(r'\b(R\d+|P\d)\b', text))


def parse(path):
    out = []
    for line in open(path):
        m = LINE.match(line)
        if not m:
            continue
        guard, op, args = (m.group(2) or '').strip(), m.group(3), m.group(4).replace('.reuse', '')
        operands = [a.strip() for a in args.split(',')] if args else []
        reads = registers(guard)
        if op.startswith(('FSETP', 'ISETP')):  # two predicate results, then sources
            writes = {a for a in operands[:2] if re.fullmatch(r'P\d', a)}
            for a in operands[2:]:
                reads |= registers(a)
        elif op.startswith(('ST', 'BRA', 'BAR', 'EXIT', 'RET')):
            writes = set()
            for a in operands:
                reads |= registers(a)
        else:
            writes = registers(operands[0]) if operands else set()
            for a in operands[1:]:
                reads |= registers(a)
        stop = op == 'FFMA' and EXPONENT_FMA.fullmatch(args) is not None
        out.append(dict(text=line.strip(), op=op, guarded=bool(guard), writes=writes, reads=reads, stop=stop))
    return out


def backward_slice(ins, root):
    need, got = set(ins[root]['reads']), {root}
    for j in range(root - 1, -1, -1):
        hit = ins[j]['writes'] & need
        if not hit:
            continue
        got.add(j)
        if not ins[j]['guarded']:
            need -= hit
        if not ins[j]['stop']:
            need |= ins[j]['reads']
        if not need:
            break
    return sorted(got)


def count(path):
    ins = parse(path)
    roots = [i for i, x in enumerate(ins)
             if (x['op'] == 'SEL' and '0x7fc00000' in x['text']) or (x['op'] == 'FSEL' and '+QNAN' in x['text'])]
    slices = [backward_slice(ins, r) for r in roots]
    if not slices:
        bad_input('no exp2_poly (no canonical-NaN SEL or FSEL) in the listing')
    shared = Counter(j for s in slices for j in s)
    for j in slices[0]:
        print(('shared  ' if shared[j] > 1 else '        ') + ins[j]['text'])
    sizes = Counter()
    for s in slices:
        own = [j for j in s if shared[j] == 1]
        sizes[len(own)] += 1
        ops = Counter(ins[j]['op'] for j in own)
    print(f'{len(slices)} exponentials; instructions of its own per score: ' +
          ', '.join(f'{n} ({k} scores)' for n, k in sorted(sizes.items())) +
          f'; shared: {sum(1 for j, k in shared.items() if k > 1)}')
    print('last slice by opcode:', dict(sorted(ops.items())))
    return 0 if len(sizes) == 1 else 1


if __name__ == '__main__':
    if len(sys.argv) == 4 and sys.argv[1] == 'section':
        section(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == 'count':
        sys.exit(count(sys.argv[2]))
    else:
        bad_input(__doc__)
