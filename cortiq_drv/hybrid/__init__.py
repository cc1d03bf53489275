"""The CUDA hybrid arm (cuda_hybrid.rs), one module per part: api (the graph contract: token,
batch), plan (a stack resolved for the card), state (HState, Card, K/V mirrors, GDN states,
RowIO), admit / book (states to a call's position, its records), graphs / launch (the small
path's launches and recorded graphs), big / bigfit (the prompt path and its budget), spec
(restore, snapshots), repack / mma / mats (q4tp in the tensor-core layout, job tables, DevMat and
the plan arena), kernels_ref / kernels_big_ref (numpy references of the kernels). Importing
touches no driver."""
