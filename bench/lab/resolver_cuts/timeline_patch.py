"""Experiment only: per-block timestamps at the phase boundaries of the
resolver kernel (cpp/cuda/resolve_residency.cu as of 6608e36; applies
unchanged to the kernels of a54eeea and of session 7, whose kernel is a
template: both instantiations get the stamps).

Thread 0 of every block writes %globaltimer and clock64 at: 0 entry,
1 after griddepcontrol.wait, 2 B1, 3 before B2 (union built), 4 B3,
5 after the fused gather's stage issue, 6 B6, 7 end of phase F, 8 staged
rows landed (fused), 9 exit, 10 after the early stage's issue (kernels
that have it, session 7), 11 exit of a block past the batch, 12 / 13
before / after the held filter's wait for the dgi row (early stage), 14
before B2a, 15 after B2a (for a request of several chunks, the last
chunk's). The buffer's device address comes from HS_RESOLVER_TIMELINE at each launch
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


rep("  bool bulk_stage;\n", "  bool bulk_stage;\n  long long* timeline;\n")
# Since session 7 the kernel is a template (template <bool kEarlyStage>).
kernel_head = "__global__ void __launch_bounds__(kThreads, 1)\n    resolve_residency_kernel("
if "template <bool kEarlyStage>\n" + kernel_head in s:
    kernel_head = "template <bool kEarlyStage>\n" + kernel_head
rep(kernel_head,
    """__device__ __forceinline__ void tl_stamp(long long* tl, int launch, int point) {
  if (tl == nullptr || launch < 0 || launch >= 256) return;
  long long gt;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt));
  long long* rec = tl + 16 + ((static_cast<long long>(launch) * 512 + blockIdx.x) * 16 + point) * 2;
  rec[0] = gt;
  rec[1] = clock64();
}
#define TL(point) do { if (threadIdx.x == 0) tl_stamp(c.timeline, tl_launch, point); } while (0)

""" + kernel_head)
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
# Kernels with the early stage (session 7): point 10 where a chunk's sure
# misses start their copies (after its rank scan), in thread 0's program order.
if "        if (stage_now) staged_early = sure_misses;\n" in s:
    rep("        if (stage_now) staged_early = sure_misses;\n",
        "        if (stage_now) staged_early = sure_misses;\n        if (stage_now) TL(10);\n")
    # 12 / 13 around the held filter's wait for the dgi row (the filter is
    # built between 13 and 14).
    rep("        wait_async_copies<0>();\n        for_each_own_int32_copy(dgi_row, H,",
        "        TL(12);\n        wait_async_copies<0>();\n        TL(13);\n        for_each_own_int32_copy(dgi_row, H,")
# 14 before B2a, 15 after B2a (and the early stage's checks), before the rank scan.
rep("      __syncthreads();  // B2a: every insertion and marker of the chunk is in place\n",
    "      TL(14);\n      __syncthreads();  // B2a: every insertion and marker of the chunk is in place\n")
rep("      int32_t new_keys;\n", "      TL(15);\n      int32_t new_keys;\n")
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
