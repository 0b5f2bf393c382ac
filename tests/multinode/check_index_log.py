#!/usr/bin/env python3
"""Checks that an interrupted epoch visited each sample exactly once.

    check_index_log.py EPOCH SIZE LOG...

Each LOG is one rank's `index_log` (lockstep/data/data_loader.h), appended to
by every process that held that rank, attempt after attempt. A "resume ..."
line starts a new attempt: its workers resumed from a checkpoint taken when
the first D entries of the epoch's order were done. Batches an earlier
attempt trained past that point were thrown away with it, so the samples the
run kept are: each attempt's batches whose `done` is at most the next
attempt's resume point, and the last attempt's batches. Those must hold each
of the SIZE samples of EPOCH exactly once.
"""
import re
import sys
from collections import Counter

BATCH = re.compile(r"^epoch (\d+) batch (\d+) done (\d+):(?: (.*))?$")
RESUME = re.compile(r"^resume epoch (\d+) done (\d+) of (\d+), world (\d+)$")


def main():
    epoch, size, logs = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    batches = []  # (attempt, done, indices)
    resume_points = {}  # attempt -> (epoch, done, world)
    for path in logs:
        attempt = 0
        with open(path) as log:
            for line in log:
                line = line.rstrip("\n")
                resumed = RESUME.match(line)
                if resumed:
                    attempt += 1
                    point = (int(resumed.group(1)), int(resumed.group(2)), int(resumed.group(4)))
                    if resume_points.setdefault(attempt, point) != point:
                        sys.exit(f"FAIL: attempt {attempt} resumed at {point} in {path} but at "
                                 f"{resume_points[attempt]} elsewhere")
                    continue
                batch = BATCH.match(line)
                if not batch:
                    sys.exit(f"FAIL: {path}: unreadable line {line!r}")
                if int(batch.group(1)) == epoch:
                    indices = [int(i) for i in batch.group(4).split(",")] if batch.group(4) else []
                    batches.append((attempt, int(batch.group(3)), indices))
    last = max([a for a, _, _ in batches], default=0)
    kept, redone = Counter(), 0
    for attempt, done, indices in batches:
        if attempt < last:
            resumed_epoch, resumed_done, _ = resume_points[attempt + 1]
            if resumed_epoch < epoch or (resumed_epoch == epoch and done > resumed_done):
                redone += len(indices)
                continue
        kept.update(indices)
    missing = [i for i in range(size) if kept[i] == 0]
    twice = sorted(i for i, n in kept.items() if n > 1)
    if missing or twice or len(kept) != size:
        sys.exit(f"FAIL: epoch {epoch}: {len(missing)} samples missing (first {missing[:5]}), "
                 f"{len(twice)} taken more than once (first {twice[:5]}), {len(kept)} distinct of {size}")
    worlds = [resume_points[a][2] for a in sorted(resume_points)]
    print(f"epoch {epoch}: each of the {size} samples exactly once over {last + 1} attempts "
          f"(resumed at {[resume_points[a][1] for a in sorted(resume_points)]} with worlds {worlds}; "
          f"{redone} samples of discarded steps left out)")


if __name__ == "__main__":
    main()
