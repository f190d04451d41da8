/**
 * The per-(worker, dp rank) ordering state of the source supervisor (recovery-events.md §2,
 * snapshot P `worker_query_state.rs`): the cursor of the last admitted event, the live-event
 * decision table, and the bounded buffer of live events that arrive while a recovery is in flight.
 *
 * Pure and synchronous: the supervisor performs every admission, reset and recovery the returned
 * actions ask for, and only then commits the outcome here.
 *
 * EXTENSION — commit groups. Engine-format sources (vLLM / SGLang) map a whole ZeroMQ batch to one
 * event id (`event_id = seq + 1` for every event of the batch, PROTOCOL.md §3), so ids are not
 * unique per event. The unit this state observes, buffers, de-duplicates and admits is therefore a
 * COMMIT GROUP: a run of consecutive events with the same event id within one live batch (or one
 * recovery response). Dynamo sources have one event per id, so every group holds one event and the
 * behaviour is exactly the seed's. The cursor advances only after every event of a group was
 * admitted, and the buffer bound, `max_seen` and the fast-prune margin count groups.
 */

import type { RouterEvent } from "../protocol/Events.js"

/** Buffer bound (in commit groups); on overflow the oldest entries are dropped. */
export const RECOVERY_PENDING_LIVE_EVENT_LIMIT = 1024
/** `plan_pending_drain` discards everything before `len - margin` in one step when that entry is stale. */
const RECOVERY_PENDING_FAST_PRUNE_MARGIN = 10

/** A run of consecutive events that share one event id; never empty. */
export interface CommitGroup {
  readonly eventId: number
  readonly events: ReadonlyArray<RouterEvent>
}

/** Splits a live batch (or a recovery response) into commit groups, preserving order. */
export const commitGroups = (events: ReadonlyArray<RouterEvent>): Array<CommitGroup> => {
  const groups: Array<CommitGroup> = []
  let start = 0
  for (let i = 1; i <= events.length; i++) {
    if (i === events.length || events[i]!.eventId !== events[start]!.eventId) {
      groups.push({ eventId: events[start]!.eventId, events: events.slice(start, i) })
      start = i
    }
  }
  return groups
}

/** A commit group of one event. */
export const singleEventGroup = (event: RouterEvent): CommitGroup => ({
  eventId: event.eventId,
  events: [event]
})

const containsClear = (group: CommitGroup): boolean =>
  group.events.some((event) => event.data._tag === "Cleared")

/** `CursorState::observe` of the simple cursor (recovery-events.md §2.1); `undefined` is `Initial`. */
type CursorObservation =
  | { readonly _tag: "Initial"; readonly got: number }
  | { readonly _tag: "Stale"; readonly got: number; readonly lastApplied: number }
  | { readonly _tag: "Contiguous"; readonly got: number }
  | { readonly _tag: "Gap"; readonly expected: number; readonly got: number }

/** What an arriving event id means against the rank's cursor: first, next, or a gap. */
export const observeCursor = (cursor: number | undefined, got: number): CursorObservation => {
  if (cursor === undefined) return { _tag: "Initial", got }
  if (got <= cursor) return { _tag: "Stale", got, lastApplied: cursor }
  if (got === cursor + 1) return { _tag: "Contiguous", got }
  return { _tag: "Gap", expected: cursor + 1, got }
}

/** What to do with a live event group of a rank. */
export type LiveEventAction =
  | { readonly _tag: "Ignore" }
  /** Admit the group; commit with `commitLiveAdmission(eventId)` once every event was admitted. */
  | { readonly _tag: "Apply"; readonly eventId: number; readonly group: CommitGroup }
  /** Cancel this rank's recovery, `discardRecoveryBeforeClear`, admit the group, commit. */
  | { readonly _tag: "Clear"; readonly eventId: number; readonly group: CommitGroup }
  /** `reset`: clear the rank first. Snapshot P always asks for a full restore (`start` undefined). */
  | {
      readonly _tag: "Recover"
      readonly startEventId: number | undefined
      readonly endEventId: number | undefined
      readonly reset: boolean
    }
  /** Live-only gap: reset the rank, admit the group, commit; the rank serves a live-only index. */
  | { readonly _tag: "ResetDegraded"; readonly group: CommitGroup }
  /**
   * The publisher counts from its first id again (an engine restarted under the same publisher
   * id): cancel any recovery, reset the rank, start from a fresh state and observe the group again.
   */
  | { readonly _tag: "Restart"; readonly group: CommitGroup }

const IGNORE: LiveEventAction = { _tag: "Ignore" }

interface PendingDrainPlan {
  /** The buffered tail to admit after the recovered events, flattened in group order. */
  readonly events: ReadonlyArray<RouterEvent>
  readonly cursor: number | undefined
  /** Set when the drain found a hole or a buffered group was lost: recover again from here. */
  readonly nextRecoveryStart: number | undefined
}

const byEventId = (a: CommitGroup, b: CommitGroup): number => a.eventId - b.eventId

/** One rank's ingest cursor and recovery state, as its supervisor tracks them. */
export class RankState {
  /**
   * The id of the last group admitted to the target's queue: queue admission, not confirmed
   * application. `undefined` is the initial cursor. It advances only after every event of a commit
   * group was admitted, and never moves backwards except through a reset or re-activation.
   */
  cursor: number | undefined = undefined
  /**
   * A worker query for this rank is outstanding or queued. While set, nothing but a Clear reaches
   * the target from the live path: everything else is buffered.
   */
  recoveryInflight = false
  private pending: Array<CommitGroup> = []
  /** Highest group id ever buffered: detects buffered groups lost to the bound or never delivered. */
  private maxSeenLiveId: number | undefined = undefined

  lastAdmittedId(): number | undefined {
    return this.cursor
  }

  /** Buffered live events (sum over the buffered groups). */
  pendingLiveEventCount(): number {
    let count = 0
    for (const group of this.pending) count += group.events.length
    return count
  }

  pendingGroupCount(): number {
    return this.pending.length
  }

  maxSeenId(): number | undefined {
    return this.maxSeenLiveId
  }

  /** Reset to defaults; a recoverable source starts out waiting for its initial restore. */
  activate(recoverable: boolean): void {
    this.cursor = undefined
    this.pending = []
    this.maxSeenLiveId = undefined
    this.recoveryInflight = recoverable
  }

  observeLiveEvent(event: RouterEvent, recoverable: boolean, incrementalGaps = false): LiveEventAction {
    return this.observeLiveGroup(singleEventGroup(event), recoverable, incrementalGaps)
  }

  /**
   * The decision table of recovery-events.md §2.3, applied to one commit group.
   *
   * `incrementalGaps` selects the newest reference's gap handling (§2.7(c)): ask for the missing
   * range from `expected` without pre-clearing the rank. Engine replay endpoints keep a bounded
   * history of batches, so the snapshot-P answer (clear, then replay everything from seq 0) stops
   * being possible once that history no longer reaches the start, and every gap would then wipe
   * the rank; a range replay keeps the rank and degrades only the missing span.
   */
  observeLiveGroup(
    group: CommitGroup,
    recoverable: boolean,
    incrementalGaps = false,
    restartsAtFirstId = false
  ): LiveEventAction {
    const id = group.eventId
    // Engines count batches from seq 0 (event id 1) again after a restart (PROTOCOL §3.2). The
    // transport passes such a batch on only when it follows a later one, so past the first id it
    // is a new incarnation, not a duplicate.
    if (restartsAtFirstId && id === 1 && this.cursor !== undefined && this.cursor > 1)
      return { _tag: "Restart", group }
    // A clear is handled before the cursor, whatever `recoveryInflight` is: it supersedes any gap
    // recovery of this rank.
    if (containsClear(group)) {
      if (this.cursor !== undefined && id <= this.cursor) return IGNORE
      return { _tag: "Clear", eventId: id, group }
    }
    const observation = observeCursor(this.cursor, id)
    if (observation._tag === "Stale") return IGNORE
    if (this.recoveryInflight) {
      this.observeAndBuffer(group)
      return IGNORE
    }
    if (observation._tag === "Initial" && recoverable) {
      this.observeAndBuffer(group)
      this.recoveryInflight = true
      return { _tag: "Recover", startEventId: undefined, endEventId: undefined, reset: false }
    }
    if (observation._tag === "Gap") {
      if (!recoverable) return { _tag: "ResetDegraded", group }
      this.observeAndBuffer(group)
      this.recoveryInflight = true
      if (incrementalGaps) {
        return { _tag: "Recover", startEventId: observation.expected, endEventId: undefined, reset: false }
      }
      return { _tag: "Recover", startEventId: undefined, endEventId: undefined, reset: true }
    }
    return { _tag: "Apply", eventId: id, group }
  }

  /**
   * Whether `observeLiveGroup` would answer `Apply` for a group with this id (and a Cleared event
   * in it when `hasClear`), without observing it: the live hot path admits such a group at once
   * and leaves every other case to `observeLiveGroup`. Pure. (A restart needs no flag here: its
   * id 1 is never contiguous with the cursor above 1 that makes it one.)
   */
  appliesLive(eventId: number, hasClear: boolean, recoverable: boolean): boolean {
    if (hasClear || this.recoveryInflight) return false
    const cursor = this.cursor
    // Initial: applied only when there is nothing to recover from.
    if (cursor === undefined) return !recoverable
    return eventId === cursor + 1
  }

  commitLiveAdmission(eventId: number): void {
    this.cursor = eventId
    this.clearMaxSeenIfCaughtUp(eventId)
  }

  /** Called before admitting a Clear: the clear makes any buffered history irrelevant. */
  discardRecoveryBeforeClear(): void {
    this.recoveryInflight = false
    this.pending = []
    this.maxSeenLiveId = undefined
  }

  /** Adopt the recovered watermark; stay in flight so concurrent arrivals keep buffering. */
  beginSuccessfulRecoveryDrain(cursor: number): void {
    this.cursor = cursor
    this.recoveryInflight = true
  }

  /**
   * Consumes the buffer up to the first hole (recovery-events.md §2.5). It never writes back
   * `cursor` or `recoveryInflight`; run it on a clone and install the clone only after every
   * returned event was admitted.
   */
  planPendingDrain(): PendingDrainPlan {
    const buffer = this.pending
    buffer.sort(byEventId)
    let last = this.cursor ?? 0
    let cursor = this.cursor
    let index = 0
    // Safe because the buffer is sorted: everything before a stale entry is stale too.
    if (buffer.length > RECOVERY_PENDING_FAST_PRUNE_MARGIN) {
      const probe = buffer.length - RECOVERY_PENDING_FAST_PRUNE_MARGIN
      if (buffer[probe]!.eventId <= last) index = probe
    }
    const events: Array<RouterEvent> = []
    let nextRecoveryStart: number | undefined
    for (;;) {
      if (index === buffer.length) {
        this.clearMaxSeenIfCaughtUp(last)
        // A seen id above the cursor was never admitted: it was dropped by the bound or never
        // delivered, so the drain must not report completion.
        if (this.maxSeenLiveId !== undefined && this.maxSeenLiveId > last) nextRecoveryStart = last + 1
        break
      }
      const front = buffer[index]!
      if (front.eventId <= last) {
        index++
        continue
      }
      if (front.eventId !== last + 1) {
        nextRecoveryStart = last + 1
        break
      }
      index++
      last = front.eventId
      cursor = front.eventId
      for (const event of front.events) events.push(event)
    }
    this.pending = buffer.slice(index)
    return { events, cursor, nextRecoveryStart }
  }

  commitPendingDrain(cursor: number | undefined, nextRecoveryStart: number | undefined): void {
    this.cursor = cursor
    this.clearMaxSeenIfCaughtUp(this.cursor ?? 0)
    this.recoveryInflight = nextRecoveryStart !== undefined
  }

  /** Used when fencing: drop the recovery and everything buffered for it. */
  finishFailedRecovery(): void {
    this.recoveryInflight = false
    this.pending = []
    this.maxSeenLiveId = undefined
  }

  /**
   * Drains the whole buffer in id order, one group per id, keeping only groups after the cursor:
   * the degraded path admits them and accepts the gaps. Cursor and `recoveryInflight` are untouched.
   */
  takeFailedRecoveryDegraded(): Array<RouterEvent> {
    const buffer = this.pending
    this.pending = []
    // Stable sort: of two deliveries of one id the first arrival is kept.
    buffer.sort(byEventId)
    const floor = this.cursor ?? 0
    const events: Array<RouterEvent> = []
    let previous: number | undefined
    for (const group of buffer) {
      if (group.eventId === previous) continue
      previous = group.eventId
      if (group.eventId <= floor) continue
      for (const event of group.events) events.push(event)
    }
    return events
  }

  commitFailedRecoveryDegraded(lastEventId: number | undefined): void {
    if (lastEventId !== undefined) this.cursor = lastEventId
    this.recoveryInflight = false
    this.maxSeenLiveId = undefined
  }

  clone(): RankState {
    const copy = new RankState()
    copy.cursor = this.cursor
    copy.recoveryInflight = this.recoveryInflight
    copy.pending = this.pending.slice()
    copy.maxSeenLiveId = this.maxSeenLiveId
    return copy
  }

  private observeAndBuffer(group: CommitGroup): void {
    this.maxSeenLiveId = Math.max(this.maxSeenLiveId ?? 0, group.eventId)
    this.pending.push(group)
    while (this.pending.length > RECOVERY_PENDING_LIVE_EVENT_LIMIT) this.pending.shift()
  }

  private clearMaxSeenIfCaughtUp(lastAdmitted: number): void {
    if (this.maxSeenLiveId !== undefined && this.maxSeenLiveId <= lastAdmitted) this.maxSeenLiveId = undefined
  }
}
