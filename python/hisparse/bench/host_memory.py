"""Where host memory goes, from /proc: the system's counters, this process's
private memory, and the resident bytes of one mapping. Linux only; used by
the shared host pool's benchmark and tests to show one copy of a pool."""

from __future__ import annotations

__all__ = ["meminfo", "rss_anon", "mapping_usage"]


def meminfo(field: str) -> int:
    """A /proc/meminfo figure in bytes ("Shmem", "MemAvailable", ...); 0 when absent."""
    with open("/proc/meminfo") as lines:
        for line in lines:
            if line.startswith(field + ":"):
                return int(line.split()[1]) << 10
    return 0


def rss_anon() -> int:
    """This process's resident private anonymous bytes."""
    with open("/proc/self/status") as lines:
        for line in lines:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) << 10
    return 0


def mapping_usage(address: int) -> dict:
    """Rss, Pss and private (clean + dirty) bytes of this process's mapping that holds ``address``.

    Pss shares each page among the processes that map it, so the Pss of one
    shared region summed over every process that maps it counts its resident
    pages once; a page only this process maps counts as private.
    """
    usage = {"rss": 0, "pss": 0, "private": 0}
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if "-" in head[0] and ":" not in head[0]:
                if inside:
                    break
                start, end = (int(x, 16) for x in head[0].split("-"))
                inside = start <= address < end
            elif inside and head[0] in ("Rss:", "Pss:", "Private_Clean:", "Private_Dirty:"):
                key = {"Rss:": "rss", "Pss:": "pss"}.get(head[0], "private")
                usage[key] += int(head[1]) << 10
    return usage
