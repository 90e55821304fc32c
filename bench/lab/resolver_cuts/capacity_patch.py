"""Experiment only: HS_RESOLVER_UNION_MULT multiplies the union capacity the
shared layout is sized for (the kernel still stops at max_union_rows), so the
hash table holds the same keys at a lower load factor.

Applies to session 3's launcher (commit 3b94e53 and earlier). The launcher
now takes the roomiest table that fits by itself; launch_patch.py's
HS_RESOLVER_MAX_SLACK varies it."""
import sys
path = sys.argv[1]
s = open(path).read()
old = "  const ResolverSharedLayout layout = resolver_shared_layout(params.hot_size, params.max_union_rows);\n"
if s.count(old) != 1:
    sys.exit("capacity_patch.py: this launcher already sizes the table itself; use launch_patch.py "
             "(HS_RESOLVER_MAX_SLACK) instead")
s = s.replace(old, "  const char* mult_env = std::getenv(\"HS_RESOLVER_UNION_MULT\");\n"
              "  const int32_t mult = mult_env ? std::atoi(mult_env) : 1;\n"
              "  const ResolverSharedLayout layout = resolver_shared_layout(params.hot_size, params.max_union_rows * mult);\n")
open(path, "w").write(s)
print("patched capacity", path)
