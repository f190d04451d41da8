/**
 * How the owner table and the lineage tables grow: the policy they share (see "Growth without a
 * pause" in docs/decisions.md).
 */

/** Tables up to this many slots are rehashed at once when they grow; larger ones move gradually. */
export const REHASH_AT_ONCE_SLOTS = 4096

/**
 * Old-table slots moved per insert while a larger table grows. The shortest growth step (the
 * owner table's 1.25× to its hint; the lineage grows by 1.5×) leaves room for 0.2 × the old
 * capacity of inserts before the new table is full; at 128 slots per insert the move ends after
 * 1/128 of it. One insert then costs a few µs more instead of the whole table's rehash at once
 * (~25 ms for 420k entries on this VM, a stall every publication behind it waited out). At 32 the
 * move lasted four times as many inserts, each looking for new keys in both tables: a 1M fill took
 * 5–10% more CPU per block.
 */
export const MOVE_SLOTS_PER_INSERT = 128
