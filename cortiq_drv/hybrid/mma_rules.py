"""The measured rules by which a set of q4tp matrices (`mma.MmaSet`) picks its launches: the
reference's `mmaset_kind_` rules (`set_rules`: KS and TB of a set), and the choices made here on
top of them for one- and two-row calls (`evens_tiles`: one tile a block; `stages_b`: a one-row
call's columns staged in shared memory; `fewer_waves`: hy_mmp_1 for hy_mmv), for 3..8-row
calls (`one_wave`: hy_mmr for hy_mmp_1) and for 11..16-row calls (`four_tiles`: four tiles a
block). Only `set_rules`' KS changes a row's bits; every other choice runs the same sums. Each
rule gives the H200 measurements it rests on.
"""

from __future__ import annotations

# Rows of a set from which its tiles are split over 8 warps, not 16 (`set_rules`).
KS16_ROWS = 5120


def set_rules(rows: list[int]) -> tuple[bool, bool]:
    """(ks16, tb1) of a launch over matrices of these row counts (`mmaset_kind_`): ks16: 16 warps
    a tile (KS 16) while the set has fewer than KS16_ROWS rows in all, 8 from there. The
    reference's 3090 rule takes the largest matrix, under 16 384 rows. On the H200
    (`bench_kernels --models 9B,27B --rows 1 --variants all`, session 15; 2..16 rows: session 14),
    us at 1 / 2 / 8 / 16 rows, each KS's best TB, KS 8 against KS 16: the 9B sets of 4096 rows
    lose, o (and GDN out) 6.02 / 6.06 / 8.72 / 17.05 against 5.75 / 5.78 / 8.00 / 12.98, down
    12.17 / 12.37 / 19.89 / 46.71 against 11.37 / 12.75 / 16.52 / 32.91; the 27B sets of 5120
    rows win, o (and GDN out) 8.98 / 9.13 / 15.67 / 27.8 against 10.06 / 10.11 / 17.72 / 29.84,
    down 21.56 / 23.13 / 40.07 against 25.16 / 26.21 / 41.92 (at 16 rows it loses, 106.9 against
    77.8: one-row decode is the common call), and so do the sets of 10 240 rows and more (9B
    attention q + k + v 10.36 against 12.11 at one row, though 38.91 against 35.22 at 16). In the
    decode step's graph the line holds both ways, by more than the sets alone say (H200, session
    30 calls 3-4, `bench_decode --shapes 9b|27b --source mem --skip-matvec --tokens 32 --windows
    2,3,8|2,8 --prompt 64`, device ms, two runs each): KS 8 for the 9B's 4096-row sets (o, GDN out,
    down; KS16_ROWS 4096) 2.1138 / 2.1138 against 1.9699 / 1.9648 a step, 8-row window 3.7395 /
    3.7459 against 3.3101 / 3.3024; KS 16 for the 27B's 5120-row ones (KS16_ROWS 5121) 6.4245 /
    6.4281 against 5.8862 / 5.8849, 8-row window 10.4726 / 10.4946 against 10.2723 / 10.2831. tb1:
    one tile a block when every matrix is short (K/V, <= 2048 rows). Only ks16 changes the
    arithmetic, and it depends on the matrices alone.

    The reference's third rule, tb1_n1 (one tile a block for one-row calls of 12 288 rows or
    more, against a launch's tail), is not kept: hy_mmp's grid walks its work items, so there is
    no tail to save, and on the H200 TB 1 loses there at one row (9B gate/up 24.0 against 20.9
    us, head 200.7 against 177.9). `evens_tiles` takes TB 1 where it does pay."""
    return sum(rows) < KS16_ROWS, max(rows) <= 2048


def evens_tiles(items2: int, items1: int, sms: int, cap1: int) -> bool:
    """Whether a one- or two-row call takes one tile a block (TB 1) where `set_rules` gives two
    (the same sums): TB 2's `items2` work items are more than the card's `sms`, so some SMs walk
    two while others walk one, and TB 1's `items1`, twice as many at half the work, all run at
    once on hy_mmv_1's grid (`cap1` blocks resident on the card). H200, `bench_kernels --models
    9B,27B --rows 1 --variants all` (session 15; two rows: session 14), us at one / two rows, TB 1
    against TB 2 at the set's KS: the 27B o and GDN out (160 items against 132 SMs) 8.98 / 9.13
    against 10.62 / 10.64, down 21.56 / 23.13 against 26.39 / 26.36; where TB 1 has more items
    than its grid, TB 2 wins: 9B attention in (320 items) 11.96 / 12.04 against 10.36 / 10.45,
    27B attention in (448) 18.29 / 19.37 against 17.36 / 17.49, 9B gate/up (768) 24.03 / 25.16
    against 20.94 / 20.81; with no more items than SMs it is even: 9B o at KS 8 (128 items) 6.02
    against 6.19. Four tiles a block (hy_mmp_run's TB 4 under hy_mmv / hy_mmvs at KS 8, the same
    bits; session 28, not kept), where its items fit one round or fewer, loses on every set
    measured at three blocks an SM (80 registers: 72 bytes of spills) and at two (H200, call 5,
    graph of back-to-back launches over weights larger than L2, us, the best of TB 4 against the
    rule's variant at one / two rows): 9B gate/up (384 items) 23.47 / 19.96 against 17.8 /
    18.04, 9B head 174.61 / 178.83 against 165.24 / 183.52 (at two rows it gains 2.6%), 9B GDN
    in 12.23 / 12.17 against 10.38 / 10.57, 27B gate/up (544) 33.72 / 36.27 against 31.62 /
    31.83."""
    return sms < items2 and items1 <= cap1


# Groups each block must walk for a one-row call to stage its columns (`stages_b`). H200, 9B
# shape: staging the down projection (one item of 384 groups a block) and the LM head (about 20
# items of 128) made a decode step 2.495 against 2.594 ms (device); sets of 128-256 groups a
# block lost when timed alone (GDN qkv + z 14.1 against 11.6 us, attention q + k + v 15.4
# against 12.6) and changed the step by nothing measurable then; they lose in the step's graph
# since (H200, session 26 call 11, `bench_decode --shapes 9b --source mem --skip-matvec --tokens
# 32 --windows '' --prompt 64`, device ms, two runs each, as chosen 2.0056 / 2.0034): the 9B
# gate/up sets on hy_mmvs_2_8 (two items of 128 groups a block) 2.06 / 2.0587, the GDN in and
# attention in sets on it 2.0936 / 2.0897.
STAGE_MIN_GROUPS = 384


# The one-row choices for the 9B's sets of 4096 rows at KS 16 in the decode step's graph (H200,
# session 24 call 8, the 9b step with the variant forced, `bench_decode --shapes 9b --source mem
# --skip-matvec --tokens 16 --windows '' --prompt 64`, device ms, hy_mmp_1_2_16 on the o and GDN
# out sets as `fewer_waves` took them then 2.0133 / 2.013): the o and GDN out sets on hy_mmv_2_16
# 2.0795, hy_mmv_1_16 2.0217, hy_mmp_1_1_16 2.0582, hy_mmvs_2_16 2.0028 (chosen since, `stages_b`);
# the down sets on hy_mmv_2_16 2.2968, hy_mmp_1_2_16 2.0707, hy_mmvs_1_16 2.1139 (chosen:
# hy_mmvs_2_16, `stages_b`).
# The 27B o and GDN out sets (160 items at KS 8: TB 1 by `evens_tiles`, on hy_mmv_1_8) lose
# staged in the graph, where `fewer_waves` does not hold for them (H200, session 26 call 10,
# `bench_decode --shapes 27b --source mem --skip-matvec --tokens 32 --windows '' --prompt 64`,
# device ms, two runs each, as chosen 6.0796 / 6.0812): hy_mmvs_2_8 6.1551 / 6.1533, hy_mmvs_1_8
# 6.2868 / 6.2914.
# The 8-row choices hold in the verify window's graph (H200, session 26 call 8, the 9b 8-row
# window with one set class's variant forced, `bench_decode --shapes 9b --source mem --skip-matvec
# --tokens 16 --windows 8 --prompt 64`, device ms, as chosen 3.4269 / 3.3983): gate/up on
# hy_mmp_1_1_8 3.763, hy_mmr_3_2_8 3.6115, hy_mmr_3_1_8 3.9792 (chosen: hy_mmp_1_2_8); down on
# hy_mmp_1_1_16 3.5817, o and GDN out on hy_mmp_1_1_16 3.5214 (chosen: hy_mmp_1_2_16); attention in
# and GDN in on hy_mmp_1_2_8 3.4183, hy_mmr_3_1_8 3.5739 (chosen: hy_mmr_3_2_8, `one_wave`); the
# LM head on hy_mmr_3_2_8 3.4962, hy_mmp_1_1_8 3.4861 (chosen: hy_mmp_1_2_8).


def rounds(items: int, cap: int) -> int:
    """Rounds in which a grid of `cap` resident blocks walks `items` work items."""
    return -(-items // cap)


def stages_b(items: int, gpr: int, ring_cap: int, staged_cap: int, mmp_cap: int, n: int) -> bool:
    """Whether a call of `n` rows over `items` work items of `gpr` groups each takes hy_mmvs: one
    row, and either
    - in place of hy_mmp_1 where `fewer_waves` would take it (`ring_cap`, `staged_cap`, `mmp_cap`:
      blocks resident on hy_mmv's, hy_mmvs' and hy_mmp_1's grids), when its grid walks the items in
      no more rounds than hy_mmp_1's. In the decode step's graph, where a launch's first stages
      come in while the kernel before it runs, it wins there even on one round of 128 groups a
      block, which it loses when timed alone (the 9B o and GDN out sets, 128 items at KS 16: H200,
      session 26 call 6, `bench_decode --shapes 9b,27b --source mem --skip-matvec --tokens 32
      --windows '' --prompt 64`, device ms, three runs each, 9b step 2.001 / 1.9996 / 1.9953
      against 2.0084 / 2.0083 / 2.0101, 27b 6.0303 against 6.0309; alone, session 19 call 6,
      `bench_kernels --models 9B,27B --rows 1 --variants all`, us, 5.79 against 5.57; the 27B
      attention in, 448 items of 160 groups, two rounds each, 16.47 against 17.63 alone, 27B GDN in
      16.41 against 18.10; in the graph, session 20 call 1, `bench_decode --shapes 27b --source mem
      --skip-matvec --tokens 16`, device ms, two runs each, 6.0868 / 6.0755 against 6.1836 /
      6.1829; session 30 call 6, `bench_decode --shapes 9b --source mem --skip-matvec --tokens 32
      --windows '' --prompt 64 --force KEY=VARIANT`, two runs each, against 1.9787 / 1.9777: the
      9B o and GDN out on hy_mmp_1_2_16 1.9829 / 1.9821, on hy_mmv_2_16 2.0545 / 2.0525, the 9B
      down, 128 items of 384 groups, on hy_mmv_2_16 2.2494 / 2.2496); or
    - in place of hy_mmv, when its bigger shared memory keeps every block the set could use
      resident and each block walks STAGE_MIN_GROUPS groups or more, over which the copy pays
      (the 27B shape's down and head would lose blocks: they stay on hy_mmv).
    Two rows never stage since each lane's B fragments of a group are one 16-byte load (the planes'
    fragment order): H200, `bench_kernels --models 9B,27B --rows 2,4,8,16 --variants all` (session
    14), us at two rows, staged against hy_mmv, where the rule before it staged: 9B LM head 202.4
    against 189.7, 27B head 250.1 against 229.2, 27B gate/up 38.3 against 36.8."""
    if n != 1:
        return False
    staged = rounds(items, staged_cap)
    if fewer_waves(items, ring_cap, mmp_cap):
        return staged <= rounds(items, mmp_cap)
    return staged_cap >= min(items, ring_cap) and staged * gpr >= STAGE_MIN_GROUPS


def fewer_waves(items: int, cap_mmv: int, cap_mmp: int) -> bool:
    """Whether a one- or two-row call over `items` work items takes hy_mmp_1 rather than hy_mmv (the
    same KS, so the same bits): when hy_mmp_1's grid (`cap_mmp` blocks resident on the card: fewer,
    with 128 registers a thread against hy_mmv's 80 or 64) walks the items in no more rounds than
    hy_mmv's (`cap_mmv`). H200, `bench_kernels --models 9B,27B --rows 1,2 --variants all`, us at one
    / two rows, hy_mmp_1 against hy_mmv (session12.md call 4): rounds equal, it wins: 9B o and GDN
    out (128 items, one round each) 6.0 / 6.6 against 6.6 / 7.3, 9B down at two rows 13.8 against
    15.0, 27B attention in (448 items, two rounds each) 18.2 / 20.7 against 20.6 / 26.8, 27B GDN in
    18.5 / 21.4 against 21.2 / 27.4; a round more, it loses: 9B attention in (320 items: two rounds
    against one) 14.8 / 16.8 against 10.5 / 12.1, 9B gate/up (768: three against two) 21.79 / 21.78
    against 20.94 / 20.81 (sessions 15 / 14), 27B o 12.1 against 10.7, 27B down 30.8 against 25.6.
    Until hy_mmv's whole stages ran unrolled (hy_mmp_run's UNR, session 18) hy_mmp_1 took the calls
    of three rounds and more on hy_mmv's grid too, where it won by 1-6% (27B gate/up, the LM heads);
    since then hy_mmv wins there as well (session 18 call 4, `bench_kernels --models 9B,27B --rows
    1,2 --matrices gate_up,head`, hy_mmv_2_8 against hy_mmp_1_2_8): 27B gate/up (1088 items)
    34.52 / 34.40 against 36.25 / 36.31, the 27B LM head (7760 items) 211.3 / 223.6 against 216.0 /
    224.0, the 9B head at two rows 179.6 against 193.8 (at one row it stages, `stages_b`);
    `bench_decode --shapes 27b` step 6.3533 / 6.4274 against 6.2624 / 6.3423 ms (device, two runs
    each), 9b 2.1067 against 2.1009."""
    return rounds(items, cap_mmp) <= rounds(items, cap_mmv)


# Rows from which a call at KS 8 takes four tiles a block (`four_tiles`): five n-tiles and more.
FOUR_TILES_ROWS = 11


def four_tiles(nt: int, tb: int, ks: int, n: int) -> bool:
    """Whether a call of `n` rows and variant (nt, tb, ks) takes four tiles a block (hy_mmp_2_4_8,
    the same sums): FOUR_TILES_ROWS..16 rows (NT 2, five or six n-tiles) at KS 8 where `set_rules`
    gives TB 2. Each lane's B fragments of a group then serve four tiles, which halves the B these
    calls read from L2 (at TB 2 and 16 rows, six times the weight bytes). H200, `bench_kernels
    --models 9B,27B --rows 10,12,14,16 --variants all` (session 23 call 5), us at 12 / 14 / 16 rows,
    TB 4 against TB 2: 9B gate/up 42.66 / 50.77 / 51.37 against 46.33 / 60.02 / 60.31, 9B head
    416.5 / 494.6 / 493.9 against 452.7 / 592.3 / 595.5, 9B attention in 28.72 / 33.64 / 33.79
    against 30.05 / 38.93 / 39.01, 9B GDN in 28.85 / 33.64 / 33.63 against 30.23 / 39.37 / 39.46,
    27B o 19.87 / 23.44 / 23.62 against 20.98 / 27.66 / 27.69, 27B gate/up 84.06 / 99.58 / 100.39
    against 90.18 / 121.36 / 121.62, 27B head 495.1 / 587.9 / 586.5 against 544.0 / 761.5 /
    778.1, 27B attention in 33.82 / 40.28 / 40.38 against 37.23 / 48.7 / 48.85, 27B GDN in 34.16 /
    40.69 / 40.93 against 38.08 / 52.43 / 52.84; 27B down 64.19 / 71.29 / 71.49 against 58.53 /
    106.72 / 107.03 (its 80 items of 544 groups at TB 4 leave SMs idle: the one loss, at five
    n-tiles). At four n-tiles (9, 10 rows) TB 4 loses on every set: at 10 rows 9B gate/up 50.3
    against 41.28, 9B head 476.1 against 399.5, 27B gate/up 98.03 against 79.96, 27B o 23.73
    against 19.3. At three (8 rows) it loses by more, whole stages or not (H200, session 33 call
    7, `bench_decode --shapes 9b|27b --source mem --skip-matvec --tokens 16 --windows 8 --prompt
    64`, device ms of the 8-row window, two runs each, rules 3.3312 / 3.3249 (9b) and 10.1487 /
    10.1535 (27b)): the gate/up and head sets forced onto hy_mmp_2_4_8 with its stages whole at
    up to three n-tiles (hy_mmp's WH for NT 2 too) 3.8681 / 3.8573 and 12.4908 / 12.4925, as the
    tree runs it 3.893 (9b); the GDN in and attention in sets (and the 27B down, o and GDN out) as
    well 4.1904 / 4.1899 and 14.9599 / 14.9614."""
    return nt == 2 and tb == 2 and ks == 8 and n >= FOUR_TILES_ROWS


def one_wave(items: int, cap_mmp: int, cap_mmr: int) -> bool:
    """Whether a 3..8-row call at KS 8 over `items` work items takes hy_mmr rather than hy_mmp_1
    (the same run path and sums, with 4-stage rings and 80 registers a thread for three blocks an SM
    against hy_mmp_1's two): when hy_mmr's grid (`cap_mmr` blocks resident on the card) takes every
    item at once and hy_mmp_1's (`cap_mmp`) does not. H200, before the planes' fragment order,
    `bench_kernels --models 9B,27B --rows 2,3,4,6,8 --variants all` (session13.md call 2), us at 3 /
    4 / 6 / 8 rows, hy_mmr against hy_mmp_1: one round against two, it wins: 9B attention in (320
    items) 19.0 / 21.6 / 32.2 / 34.8 against 23.7 / 26.8 / 35.6 / 39.1, 9B GDN in (384) 20.3 / 23.0
    / 34.2 / 36.9 against 24.0 / 27.3 / 36.0 / 39.6; two rounds each, it loses: 27B attention in
    (448) 41.6 / 45.5 / 65.5 / 71.1 against 29.5 / 33.8 / 44.4 / 48.6, 27B GDN in (512) 44.6 / 50.6
    / 75.6 / 81.3 against 29.8 / 34.2 / 44.9 / 49.1; many rounds, within 6% either way: 9B gate/up
    at 3 rows 39.1 against 37.1, 27B gate/up 69.1 against 72.1, the heads 358.5 against 338.2 (9B)
    and 439.2 against 412.8 (27B)."""
    return cap_mmp < items <= cap_mmr
