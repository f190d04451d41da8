/**
 * Tree dumps as an externally addressed pool replaces a rank from them.
 */

import type { DpRank, RouterEvent, WorkerId } from "../protocol/Events.js"

/**
 * A worker's cached tree dump may be extended with a tail of Stored and Removed events
 * (recovery-events.md §4.4, "safe extension"), while the actor's rank replacement takes Stored
 * events only (seed 002 rejects anything else). Replaying that tail onto the dumped blocks gives
 * the rank's state, so such a dump is folded into one Stored event of the rank's final
 * device-tier blocks. A dump holding another rank's events or a Cleared event (which no safe
 * extension carries) is passed through unchanged, so the actor still rejects it.
 */
export const foldTreeDump = (
  workerId: WorkerId,
  dpRank: DpRank,
  events: ReadonlyArray<RouterEvent>
): ReadonlyArray<RouterEvent> => {
  let storedOnly = true
  for (const event of events) {
    if (event.workerId !== workerId || event.dpRank !== dpRank) return events
    if (event.storageTier !== "device") continue
    if (event.data._tag === "Cleared") return events
    if (event.data._tag === "Removed") storedOnly = false
  }
  if (storedOnly) return events
  const blocks = new Map<string, readonly [number, number]>()
  for (const event of events) {
    if (event.storageTier !== "device") continue
    const data = event.data
    if (data._tag === "Cleared") continue
    const pairs = data.blockHashes
    for (let i = 0; i + 1 < pairs.length; i += 2) {
      const key = `${pairs[i]}:${pairs[i + 1]}`
      if (data._tag === "Stored") blocks.set(key, [pairs[i]!, pairs[i + 1]!])
      else blocks.delete(key)
    }
  }
  if (blocks.size === 0) return []
  const blockHashes = new Uint32Array(2 * blocks.size)
  let offset = 0
  for (const [hi, lo] of blocks.values()) {
    blockHashes[offset++] = hi
    blockHashes[offset++] = lo
  }
  const last = events[events.length - 1]!
  return [
    {
      workerId,
      dpRank,
      eventId: last.eventId,
      storageTier: "device",
      data: {
        _tag: "Stored",
        blockHashes,
        tokensHashes: undefined,
        parentHash: undefined,
        startPosition: undefined
      }
    }
  ]
}
