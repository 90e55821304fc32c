"""Experiment only: launch-time switches for the two Hopper paths of the
resolver launch, so one build can time each combination.
HS_RESOLVER_BULK_STAGE=0|1: the fused gather's miss stage by bulk (TMA)
copies (1, the default on sm_90) or by 16-byte cp.async (0).
HS_RESOLVER_PDL=0|1: programmatic dependent launch (1, the default on
sm_90) or a plain stream-ordered launch (0).
HS_RESOLVER_MAX_SLACK=3..6: the roomiest union table the launch may take
(half-multiples of the keys). Unset: the library's choice."""
import sys

path = sys.argv[1]
s = open(path).read()
replacements = {
    "  constants.bulk_stage = hopper;\n": (
        "  constants.bulk_stage = hopper;\n"
        "  if (const char* env = std::getenv(\"HS_RESOLVER_BULK_STAGE\")) constants.bulk_stage = hopper && env[0] == '1';\n"
    ),
    "  config.numAttrs = hopper ? 1 : 0;\n": (
        "  config.numAttrs = hopper ? 1 : 0;\n"
        "  if (const char* env = std::getenv(\"HS_RESOLVER_PDL\")) config.numAttrs = hopper && env[0] == '1' ? 1 : 0;\n"
    ),
    "  const int32_t max_slack_halves = kResolverMaxSlackHalves;\n": (
        "  int32_t max_slack_halves = kResolverMaxSlackHalves;\n"
        "  if (const char* env = std::getenv(\"HS_RESOLVER_MAX_SLACK\")) max_slack_halves = std::atoi(env);\n"
    ),
}
for old, new in replacements.items():
    assert s.count(old) == 1, old
    s = s.replace(old, new)
if "#include <cstdlib>" not in s:
    s = s.replace("#include <cstdint>\n", "#include <cstdint>\n#include <cstdlib>\n", 1)
open(path, "w").write(s)
print("patched launch switches", path)
