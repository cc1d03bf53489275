"""The CUDA hybrid arm (cuda_hybrid.rs), one module per part: repack (q4tp into the tensor-core
layout), mma (job tables, MmaSet, planes, rows_matvec), mats (DevMat, hmat / hmat_pair, the plan
arena and VRAM budget). Importing touches no driver."""
