"""The runner's persistent block-table rows against the tables built afresh each step."""

from __future__ import annotations

import random

import numpy as np

from octavo.model_executor.block_table_rows import BlockTableRows
from octavo.model_executor.step_inputs import padded_tables


def test_rows_match_fresh_tables_through_random_steps():
    """Sequences grow, shrink (preempted and re-admitted), arrive as equal copies (a rank
    in another process) and finish; every step's gather equals padded_tables, past the
    first row count and width (both grow)."""
    rng = random.Random(0)
    rows = BlockTableRows(rows=4, width=4)
    tables: dict[int, list[int]] = {}
    next_id = 0
    for _ in range(400):
        for seq_id in rng.sample(sorted(tables), k=min(len(tables), rng.randint(0, 2))):
            del tables[seq_id]  # finished or preempted
            rows.forget([seq_id])
        while len(tables) < rng.randint(1, 12):
            tables[next_id] = [rng.randrange(1, 1000) for _ in range(rng.randint(1, 3))]
            next_id += 1
        for seq_id, ids in tables.items():
            change = rng.random()
            if change < 0.2:  # a new block: the scheduler builds a new list
                tables[seq_id] = [*ids, rng.randrange(1, 1000)]
            elif change < 0.3:  # the same ids in a new list
                tables[seq_id] = list(ids)
            elif change < 0.35:  # copy-on-write: the last block replaced
                tables[seq_id] = [*ids[:-1], rng.randrange(1, 1000)]
            elif change < 0.4:  # preempted, then admitted again with fewer blocks
                rows.forget([seq_id])
                tables[seq_id] = [rng.randrange(1, 1000)]
        step = rng.sample(sorted(tables), k=rng.randint(1, len(tables)))
        step += step[:1]  # a verification's rows share one sequence's table
        lists = [tables[seq_id] for seq_id in step]
        np.testing.assert_array_equal(rows.gather(step, lists), padded_tables(lists))
    assert rows.array.shape[0] > 4 and rows.array.shape[1] > 4
    assert len(rows) <= len(tables)


def test_unchanged_list_is_not_rewritten_and_forget_frees_the_row():
    rows = BlockTableRows(rows=2, width=2)
    ids = [5, 6, 7]
    rows.gather([1], [ids])
    rows.array[0, 0] = 99  # a row written again would lose this
    assert rows.gather([1], [ids])[0, 0] == 99  # the same list: nothing rewritten
    assert rows.gather([1], [[5, 6, 7]])[0, 0] == 99  # equal ids: compared, kept
    assert rows.gather([1], [[5, 6, 8]]).tolist() == [[5, 6, 8]]
    rows.forget([1, 2])  # 2 holds no row
    assert len(rows) == 0 and not rows.array[0].any()
    assert rows.gather([3], [[4]]).tolist() == [[4]]
    assert rows.gather([], []).shape == (0, 1)
