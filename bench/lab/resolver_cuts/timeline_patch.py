"""Experiment only: per-block timestamps at the phase boundaries of the
resolver kernel (cpp/cuda/resolve_residency.cu as of 6608e36; applies
unchanged to the kernel of a54eeea).

Thread 0 of every block writes %globaltimer and clock64 at: 0 entry,
1 after griddepcontrol.wait, 2 B1, 3 before B2 (union built), 4 B3,
5 after the fused gather's stage issue, 6 B6, 7 end of phase F, 8 staged
rows landed (fused), 9 exit, 11 exit of a block past the batch. The
buffer's device address comes from HS_RESOLVER_TIMELINE at each launch
(unset: no stamps). Layout (int64): [0] a block counter, then record
(launch, block, point) = {globaltimer, clock64} at
16 + ((launch * 512 + block) * 16 + point) * 2, launch = the counter's
value at block entry / gridDim.x (blocks of launch n + 1 start only after
every block of launch n has started, also under programmatic launch).
timeline.py reads it."""
import sys

path = sys.argv[1]
s = open(path).read()


def rep(old, new):
    global s
    assert s.count(old) == 1, old
    s = s.replace(old, new)


rep("  bool bulk_stage;\n};", "  bool bulk_stage;\n  long long* timeline;\n};")
rep("__global__ void __launch_bounds__(kThreads, 1)\n    resolve_residency_kernel(",
    """__device__ __forceinline__ void tl_stamp(long long* tl, int launch, int point) {
  if (tl == nullptr || launch < 0 || launch >= 256) return;
  long long gt;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt));
  long long* rec = tl + 16 + ((static_cast<long long>(launch) * 512 + blockIdx.x) * 16 + point) * 2;
  rec[0] = gt;
  rec[1] = clock64();
}
#define TL(point) do { if (threadIdx.x == 0) tl_stamp(c.timeline, tl_launch, point); } while (0)

__global__ void __launch_bounds__(kThreads, 1)
    resolve_residency_kernel(""")
rep("""  const int32_t max_union = p.max_union_rows;

  // ---- Phase A. Under""", """  const int32_t max_union = p.max_union_rows;
  int tl_launch = -1;
  if (threadIdx.x == 0 && c.timeline != nullptr) {
    tl_launch = static_cast<int>(atomicAdd(reinterpret_cast<unsigned long long*>(c.timeline), 1ull) / gridDim.x);
  }
  TL(0);

  // ---- Phase A. Under""")
rep("  wait_for_prior_grid();\n  // Every load", "  wait_for_prior_grid();\n  TL(1);\n  // Every load")
rep("""  if (b >= B) {
    write_orphan_rows(p, valid_rows, orphan_owner);
    return;""", """  if (b >= B) {
    write_orphan_rows(p, valid_rows, orphan_owner);
    TL(11);
    return;""")
rep("  __syncthreads();  // B1\n", "  __syncthreads();  // B1\n  TL(2);\n")
rep("  __syncthreads();  // B2: ranks", "  TL(3);\n  __syncthreads();  // B2: ranks")
rep("  __syncthreads();  // B3\n", "  __syncthreads();  // B3\n  TL(4);\n")
rep("""    if (!c.bulk_stage) commit_async_copies();
  }

  // ---- Phase C2""", """    if (!c.bulk_stage) commit_async_copies();
  }
  TL(5);

  // ---- Phase C2""")
rep("  __syncthreads();  // B6: member slots final, new LRU complete\n",
    "  __syncthreads();  // B6: member slots final, new LRU complete\n  TL(6);\n")
rep("  // ---- Phase G (fused gather, staged misses)", "  TL(7);\n  // ---- Phase G (fused gather, staged misses)")
rep("""        mbarrier_wait_first_phase(stage_barrier);
      } else {""", """        mbarrier_wait_first_phase(stage_barrier);
        TL(8);
      } else {""")
rep("""      }
    }
  }
}

// cudaFuncSetAttribute""", """      }
    }
  }
  TL(9);
}

// cudaFuncSetAttribute""")
rep("  constants.bulk_stage = hopper;\n", """  constants.bulk_stage = hopper;
  constants.timeline = nullptr;
  if (const char* env = std::getenv("HS_RESOLVER_TIMELINE")) {
    constants.timeline = reinterpret_cast<long long*>(std::strtoull(env, nullptr, 0));
  }
""")
if "#include <cstdlib>" not in s:
    s = s.replace("#include <cstdint>\n", "#include <cstdint>\n#include <cstdlib>\n", 1)
open(path, "w").write(s)
print("patched timeline stamps", path)
