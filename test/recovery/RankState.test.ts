import { describe, expect, it } from "@effect/vitest"
import fc from "fast-check"
import { hashPairsToBigInts } from "../../src/ckf/u64.js"
import { clearedEvent, type RouterEvent, removedEvent, storedEvent } from "../../src/protocol/Events.js"
import {
  type CommitGroup,
  commitGroups,
  type LiveEventAction,
  observeCursor,
  RankState,
  RECOVERY_PENDING_LIVE_EVENT_LIMIT,
  singleEventGroup
} from "../../src/recovery/RankState.js"

const W = "42"
const R = 4
const store = (id: number, block: number = id): RouterEvent => storedEvent(W, R, id, [block])
const clear = (id: number): RouterEvent => clearedEvent(W, R, id)
const ids = (events: ReadonlyArray<RouterEvent>): Array<number> => events.map((event) => event.eventId)

/** A rank whose cursor is at `cursor`, not in flight. */
const liveAt = (cursor: number | undefined): RankState => {
  const rank = new RankState()
  rank.activate(false)
  if (cursor !== undefined) rank.commitLiveAdmission(cursor)
  return rank
}

/** A rank at `cursor` whose recovery is in flight (as after a target fault or an initial restore). */
const inflightAt = (cursor: number | undefined): RankState => {
  const rank = liveAt(cursor)
  rank.recoveryInflight = true
  return rank
}

describe("observeCursor", () => {
  it("classifies against the simple cursor", () => {
    expect(observeCursor(undefined, 7)).toEqual({ _tag: "Initial", got: 7 })
    expect(observeCursor(5, 5)).toEqual({ _tag: "Stale", got: 5, lastApplied: 5 })
    expect(observeCursor(5, 2)).toEqual({ _tag: "Stale", got: 2, lastApplied: 5 })
    expect(observeCursor(5, 6)).toEqual({ _tag: "Contiguous", got: 6 })
    expect(observeCursor(5, 9)).toEqual({ _tag: "Gap", expected: 6, got: 9 })
  })
})

describe("RankState decision table (recovery-events.md §2.3)", () => {
  describe("step 1: clears before the cursor", () => {
    it("ignores a clear at or below the last admitted id", () => {
      for (const id of [3, 5]) {
        const rank = liveAt(5)
        expect(rank.observeLiveEvent(clear(id), true)).toEqual({ _tag: "Ignore" })
        expect(rank.pendingGroupCount()).toBe(0)
      }
    })

    it("returns Clear for a newer clear, whatever the cursor, inflight or recoverable say", () => {
      for (const rank of [liveAt(undefined), liveAt(5), inflightAt(5), inflightAt(undefined)]) {
        for (const recoverable of [true, false]) {
          const copy = rank.clone()
          const action = copy.observeLiveEvent(clear(9), recoverable)
          expect(action._tag).toBe("Clear")
          if (action._tag === "Clear") {
            expect(action.eventId).toBe(9)
            expect(action.group.events).toEqual([clear(9)])
          }
          // The caller does the work: nothing changes inside observe.
          expect(copy.cursor).toBe(rank.cursor)
          expect(copy.recoveryInflight).toBe(rank.recoveryInflight)
          expect(copy.pendingGroupCount()).toBe(0)
          expect(copy.maxSeenId()).toBeUndefined()
        }
      }
    })
  })

  it("row 1: a stale event is ignored without buffering, in flight or not", () => {
    for (const rank of [liveAt(5), inflightAt(5)]) {
      for (const recoverable of [true, false]) {
        expect(rank.observeLiveEvent(store(5), recoverable)).toEqual({ _tag: "Ignore" })
        expect(rank.observeLiveEvent(store(1), recoverable)).toEqual({ _tag: "Ignore" })
        expect(rank.pendingGroupCount()).toBe(0)
        expect(rank.maxSeenId()).toBeUndefined()
      }
    }
  })

  it("row 2: while in flight, initial, contiguous and gap events are buffered", () => {
    const initial = inflightAt(undefined)
    expect(initial.observeLiveEvent(store(4), true)).toEqual({ _tag: "Ignore" })
    expect(initial.pendingGroupCount()).toBe(1)
    expect(initial.maxSeenId()).toBe(4)

    const rank = inflightAt(5)
    expect(rank.observeLiveEvent(store(6), false)).toEqual({ _tag: "Ignore" })
    expect(rank.observeLiveEvent(store(9), true)).toEqual({ _tag: "Ignore" })
    expect(rank.pendingGroupCount()).toBe(2)
    expect(rank.maxSeenId()).toBe(9)
    expect(rank.cursor).toBe(5)
    expect(rank.recoveryInflight).toBe(true)
  })

  it("row 3: the first event of a recoverable source asks for a full restore without reset", () => {
    const rank = liveAt(undefined)
    expect(rank.observeLiveEvent(store(7), true)).toEqual({
      _tag: "Recover",
      startEventId: undefined,
      endEventId: undefined,
      reset: false
    })
    expect(rank.recoveryInflight).toBe(true)
    expect(rank.pendingGroupCount()).toBe(1)
    expect(rank.maxSeenId()).toBe(7)
    expect(rank.cursor).toBeUndefined()
  })

  it("row 4: a recoverable gap clears the rank, then asks for a full restore", () => {
    const rank = liveAt(3)
    expect(rank.observeLiveEvent(store(6), true)).toEqual({
      _tag: "Recover",
      startEventId: undefined,
      endEventId: undefined,
      reset: true
    })
    expect(rank.recoveryInflight).toBe(true)
    expect(rank.pendingGroupCount()).toBe(1)
    expect(rank.maxSeenId()).toBe(6)
    expect(rank.cursor).toBe(3)
  })

  it("row 4, incremental gaps (engine replay sources): ask for the missing range without a reset", () => {
    const rank = liveAt(3)
    expect(rank.observeLiveEvent(store(6), true, true)).toEqual({
      _tag: "Recover",
      startEventId: 4,
      endEventId: undefined,
      reset: false
    })
    expect(rank.recoveryInflight).toBe(true)
    expect(rank.pendingGroupCount()).toBe(1)
    expect(rank.cursor).toBe(3)
    // The first event still asks for a full restore: there is no cursor to continue from.
    expect(liveAt(undefined).observeLiveEvent(store(1), true, true)).toMatchObject({
      startEventId: undefined,
      reset: false
    })
  })

  it("row 5: a live-only gap degrades with a reset and the event", () => {
    const rank = liveAt(3)
    const action = rank.observeLiveEvent(store(6), false)
    expect(action).toEqual({ _tag: "ResetDegraded", group: singleEventGroup(store(6)) })
    expect(rank.recoveryInflight).toBe(false)
    expect(rank.pendingGroupCount()).toBe(0)
    expect(rank.cursor).toBe(3)
  })

  it("row 6: initial (live-only) and contiguous events apply; the cursor waits for the commit", () => {
    const initial = liveAt(undefined)
    expect(initial.observeLiveEvent(store(7), false)).toEqual({
      _tag: "Apply",
      eventId: 7,
      group: singleEventGroup(store(7))
    })
    expect(initial.cursor).toBeUndefined()
    initial.commitLiveAdmission(7)
    expect(initial.cursor).toBe(7)

    for (const recoverable of [true, false]) {
      const rank = liveAt(3)
      expect(rank.observeLiveEvent(store(4), recoverable)._tag).toBe("Apply")
      expect(rank.cursor).toBe(3)
      expect(rank.pendingGroupCount()).toBe(0)
    }
  })
})

describe("RankState commit-side operations (§2.4)", () => {
  it("activate resets to defaults and waits for the initial restore when recoverable", () => {
    const rank = inflightAt(5)
    rank.observeLiveEvent(store(8), true)
    rank.activate(true)
    expect(rank.cursor).toBeUndefined()
    expect(rank.recoveryInflight).toBe(true)
    expect(rank.pendingGroupCount()).toBe(0)
    expect(rank.maxSeenId()).toBeUndefined()
    rank.activate(false)
    expect(rank.recoveryInflight).toBe(false)
  })

  it("commitLiveAdmission clears max_seen only once caught up", () => {
    const rank = inflightAt(1)
    rank.observeLiveEvent(store(3), true)
    rank.commitLiveAdmission(2)
    expect(rank.maxSeenId()).toBe(3)
    rank.commitLiveAdmission(3)
    expect(rank.maxSeenId()).toBeUndefined()
  })

  it("discardRecoveryBeforeClear and finishFailedRecovery drop the recovery and its buffer", () => {
    for (const op of ["discard", "finish"] as const) {
      const rank = inflightAt(1)
      rank.observeLiveEvent(store(3), true)
      if (op === "discard") rank.discardRecoveryBeforeClear()
      else rank.finishFailedRecovery()
      expect(rank.recoveryInflight).toBe(false)
      expect(rank.pendingGroupCount()).toBe(0)
      expect(rank.maxSeenId()).toBeUndefined()
      expect(rank.cursor).toBe(1)
    }
  })

  it("takeFailedRecoveryDegraded sorts, de-duplicates and keeps only ids after the cursor", () => {
    const rank = inflightAt(3)
    for (const id of [7, 5, 4, 7, 5, 6]) rank.observeLiveEvent(store(id), true)
    const first7 = store(7, 700)
    rank.observeLiveEvent(first7, true)
    const taken = rank.takeFailedRecoveryDegraded()
    expect(ids(taken)).toEqual([4, 5, 6, 7])
    expect(rank.pendingGroupCount()).toBe(0)
    // Untouched until the commit.
    expect(rank.cursor).toBe(3)
    expect(rank.recoveryInflight).toBe(true)
    rank.commitFailedRecoveryDegraded(7)
    expect(rank.cursor).toBe(7)
    expect(rank.recoveryInflight).toBe(false)
    expect(rank.maxSeenId()).toBeUndefined()

    const empty = inflightAt(3)
    empty.observeLiveEvent(store(2), true)
    expect(empty.takeFailedRecoveryDegraded()).toEqual([])
    empty.commitFailedRecoveryDegraded(undefined)
    expect(empty.cursor).toBe(3)
    expect(empty.recoveryInflight).toBe(false)
  })

  it("clone is independent of the original", () => {
    const rank = inflightAt(2)
    rank.observeLiveEvent(store(4), true)
    const copy = rank.clone()
    copy.beginSuccessfulRecoveryDrain(3)
    const plan = copy.planPendingDrain()
    copy.commitPendingDrain(plan.cursor, plan.nextRecoveryStart)
    expect(copy.cursor).toBe(4)
    expect(rank.cursor).toBe(2)
    expect(rank.pendingGroupCount()).toBe(1)
    expect(rank.recoveryInflight).toBe(true)
    expect(rank.maxSeenId()).toBe(4)
  })

  it("follows the worked example of §2.5", () => {
    const rank = liveAt(1)
    expect(rank.observeLiveEvent(store(4), true)).toEqual({
      _tag: "Recover",
      startEventId: undefined,
      endEventId: undefined,
      reset: true
    })
    expect(rank.observeLiveEvent(store(3), true)).toEqual({ _tag: "Ignore" })
    const drain = rank.clone()
    drain.beginSuccessfulRecoveryDrain(2)
    const plan = drain.planPendingDrain()
    expect(ids(plan.events)).toEqual([3, 4])
    expect(plan.cursor).toBe(4)
    expect(plan.nextRecoveryStart).toBeUndefined()
    drain.commitPendingDrain(plan.cursor, plan.nextRecoveryStart)
    expect(drain.cursor).toBe(4)
    expect(drain.recoveryInflight).toBe(false)
    expect(drain.maxSeenId()).toBeUndefined()
  })

  it("plans up to a hole and asks to recover from the first missing id", () => {
    const rank = inflightAt(undefined)
    for (const id of [5, 2, 3, 3, 1, 7]) rank.observeLiveEvent(store(id), true)
    rank.beginSuccessfulRecoveryDrain(1)
    const plan = rank.planPendingDrain()
    expect(ids(plan.events)).toEqual([2, 3])
    expect(plan.cursor).toBe(3)
    expect(plan.nextRecoveryStart).toBe(4)
    // The entries after the hole stay buffered for the follow-up.
    expect(rank.pendingGroupCount()).toBe(2)
    rank.commitPendingDrain(plan.cursor, plan.nextRecoveryStart)
    expect(rank.recoveryInflight).toBe(true)
    expect(rank.maxSeenId()).toBe(7)
  })

  it("fast-prunes a sorted buffer whose stale prefix is longer than the margin", () => {
    const rank = inflightAt(undefined)
    for (let id = 1; id <= 30; id++) rank.observeLiveEvent(store(id), true)
    rank.beginSuccessfulRecoveryDrain(25)
    const plan = rank.planPendingDrain()
    expect(ids(plan.events)).toEqual([26, 27, 28, 29, 30])
    expect(plan.cursor).toBe(30)
    expect(plan.nextRecoveryStart).toBeUndefined()

    const allStale = inflightAt(undefined)
    for (let id = 1; id <= 30; id++) allStale.observeLiveEvent(store(id), true)
    allStale.beginSuccessfulRecoveryDrain(40)
    const stalePlan = allStale.planPendingDrain()
    expect(stalePlan.events).toEqual([])
    expect(stalePlan.cursor).toBe(40)
    expect(stalePlan.nextRecoveryStart).toBeUndefined()
    expect(allStale.pendingGroupCount()).toBe(0)
  })
})

describe("RankState buffer bound and loss detection", () => {
  it(`keeps at most ${RECOVERY_PENDING_LIVE_EVENT_LIMIT} groups, dropping the oldest arrivals`, () => {
    const rank = inflightAt(undefined)
    for (let id = 1; id <= RECOVERY_PENDING_LIVE_EVENT_LIMIT + 6; id++) rank.observeLiveEvent(store(id), true)
    expect(rank.pendingGroupCount()).toBe(RECOVERY_PENDING_LIVE_EVENT_LIMIT)
    expect(rank.maxSeenId()).toBe(RECOVERY_PENDING_LIVE_EVENT_LIMIT + 6)
    rank.beginSuccessfulRecoveryDrain(0)
    const plan = rank.planPendingDrain()
    // 1..6 were dropped: the front is a hole.
    expect(plan.events).toEqual([])
    expect(plan.nextRecoveryStart).toBe(1)
  })

  it("detects a lost buffered event through max_seen when the buffer drains empty", () => {
    const rank = inflightAt(undefined)
    // The newest id arrives first and is the oldest arrival when the bound overflows.
    rank.observeLiveEvent(store(5000), true)
    for (let id = 1; id <= RECOVERY_PENDING_LIVE_EVENT_LIMIT; id++) rank.observeLiveEvent(store(id), true)
    rank.beginSuccessfulRecoveryDrain(0)
    const plan = rank.planPendingDrain()
    expect(plan.events.length).toBe(RECOVERY_PENDING_LIVE_EVENT_LIMIT)
    expect(plan.cursor).toBe(RECOVERY_PENDING_LIVE_EVENT_LIMIT)
    expect(plan.nextRecoveryStart).toBe(RECOVERY_PENDING_LIVE_EVENT_LIMIT + 1)
    rank.commitPendingDrain(plan.cursor, plan.nextRecoveryStart)
    expect(rank.recoveryInflight).toBe(true)
    expect(rank.maxSeenId()).toBe(5000)
  })

  it("reports completion once the watermark covers max_seen", () => {
    const rank = inflightAt(undefined)
    rank.observeLiveEvent(store(5000), true)
    for (let id = 1; id <= RECOVERY_PENDING_LIVE_EVENT_LIMIT; id++) rank.observeLiveEvent(store(id), true)
    rank.beginSuccessfulRecoveryDrain(5000)
    const plan = rank.planPendingDrain()
    expect(plan.events).toEqual([])
    expect(plan.nextRecoveryStart).toBeUndefined()
    expect(rank.maxSeenId()).toBeUndefined()
  })
})

describe("RankState commit groups (engine batches share one event id)", () => {
  const batch = (id: number, size: number): Array<RouterEvent> =>
    Array.from({ length: size }, (_, j) => store(id, id * 100 + j))

  it("splits a batch into runs of the same id", () => {
    const events = [...batch(5, 3), ...batch(6, 1), ...batch(7, 2)]
    const groups = commitGroups(events)
    expect(groups.map((group) => [group.eventId, group.events.length])).toEqual([
      [5, 3],
      [6, 1],
      [7, 2]
    ])
    expect(groups.flatMap((group) => group.events)).toEqual(events)
    expect(commitGroups([])).toEqual([])
  })

  it("applies a whole group and advances the cursor once per group", () => {
    const rank = liveAt(4)
    const [group] = commitGroups(batch(5, 3))
    const action = rank.observeLiveGroup(group!, true)
    expect(action).toEqual({ _tag: "Apply", eventId: 5, group })
    expect(rank.cursor).toBe(4)
    rank.commitLiveAdmission(5)
    // A redelivered batch is one stale group.
    expect(rank.observeLiveGroup(group!, true)).toEqual({ _tag: "Ignore" })
    expect(rank.observeLiveGroup(commitGroups(batch(6, 2))[0]!, true)._tag).toBe("Apply")
  })

  it("buffers, de-duplicates and drains whole groups", () => {
    const rank = inflightAt(4)
    for (const group of commitGroups([...batch(7, 2), ...batch(6, 3)])) rank.observeLiveGroup(group, true)
    rank.observeLiveGroup(commitGroups(batch(6, 3))[0]!, true)
    expect(rank.pendingGroupCount()).toBe(3)
    expect(rank.pendingLiveEventCount()).toBe(8)
    expect(rank.maxSeenId()).toBe(7)

    const drain = rank.clone()
    drain.beginSuccessfulRecoveryDrain(5)
    const plan = drain.planPendingDrain()
    expect(ids(plan.events)).toEqual([6, 6, 6, 7, 7])
    expect(plan.cursor).toBe(7)

    const degraded = rank.clone().takeFailedRecoveryDegraded()
    expect(ids(degraded)).toEqual([6, 6, 6, 7, 7])
  })

  it("treats a group that contains a clear as a clear of the whole group", () => {
    const rank = inflightAt(4)
    const events = [store(6, 600), clear(6), store(6, 601)]
    const [group] = commitGroups(events)
    const action: LiveEventAction = rank.observeLiveGroup(group!, true)
    expect(action).toEqual({ _tag: "Clear", eventId: 6, group })
    expect(liveAt(6).observeLiveGroup(group!, true)).toEqual({ _tag: "Ignore" })
  })
})

// ---------------------------------------------------------------------------------------------
// Property: a model of the supervisor's use of RankState (recovery-events.md §3.2, §3.4) against
// a worker whose true history is known. Recoveries return the true history at the moment the
// worker answers; live delivery drops, duplicates and reorders batches.

type Op =
  | { readonly _tag: "Produce"; readonly copies: number }
  | { readonly _tag: "Deliver"; readonly pick: number }
  | { readonly _tag: "Answer" }
  | { readonly _tag: "Complete" }
  /** Enough batches at once, newest first, to overflow the pending buffer of an in-flight rank. */
  | { readonly _tag: "Burst"; readonly size: number }

interface Recovery {
  readonly start: number | undefined
  answered: { readonly watermark: number } | undefined
}

/** Blocks owned by the rank after applying `events` in order. */
const fold = (events: ReadonlyArray<RouterEvent>): Array<string> => {
  const blocks = new Set<string>()
  for (const event of events) {
    const data = event.data
    if (data._tag === "Cleared") blocks.clear()
    else if (data._tag === "Stored")
      for (const hash of hashPairsToBigInts(data.blockHashes)) blocks.add(`${hash}`)
    else for (const hash of hashPairsToBigInts(data.blockHashes)) blocks.delete(`${hash}`)
  }
  return [...blocks].sort()
}

const truthGroup = (id: number, size: number, kind: number): CommitGroup => {
  const events: Array<RouterEvent> = []
  for (let j = 0; j < size; j++) {
    if (kind === 0 && j === 0) events.push(clear(id))
    else if (kind === 1 && j === 0 && id > 1) events.push(removedEvent(W, R, id, [(id - 1) * 10]))
    else events.push(store(id, id * 10 + j))
  }
  return { eventId: id, events }
}

class Model {
  readonly truth: Array<CommitGroup> = []
  readonly network: Array<CommitGroup> = []
  rank = new RankState()
  recovery: Recovery | undefined
  /** What the target holds for the rank, since its last reset. */
  admitted: Array<RouterEvent> = []
  maxDelivered = 0

  constructor(
    private readonly sizes: ReadonlyArray<number>,
    private readonly kinds: ReadonlyArray<number>
  ) {
    // A recoverable source starts waiting for its initial restore (reconcile → activate + spawn).
    this.rank.activate(true)
    this.recovery = { start: undefined, answered: undefined }
  }

  produce(copies: number): void {
    const id = this.truth.length + 1
    const group = truthGroup(id, this.sizes[id % this.sizes.length]!, this.kinds[id % this.kinds.length]!)
    this.truth.push(group)
    for (let i = 0; i < copies; i++) this.network.push(group)
  }

  deliver(pick: number): void {
    if (this.network.length === 0) return
    const [group] = this.network.splice(pick % this.network.length, 1)
    this.live(group!)
  }

  burst(size: number): void {
    const first = this.truth.length + 1
    for (let i = 0; i < size; i++) this.produce(0)
    for (let id = this.truth.length; id >= first; id--) this.live(this.truth[id - 1]!)
  }

  private live(group: CommitGroup): void {
    this.maxDelivered = Math.max(this.maxDelivered, group.eventId)
    const before = this.admitted.length
    const wasInflight = this.rank.recoveryInflight
    const action = this.rank.observeLiveGroup(group, true)
    switch (action._tag) {
      case "Ignore":
        break
      case "Apply":
        this.admitted.push(...action.group.events)
        this.rank.commitLiveAdmission(action.eventId)
        break
      case "Clear":
        // The clear also drops buffered batches newer than itself, which only reordering can
        // produce (ZeroMQ keeps one publisher's order); a later batch reveals that gap.
        this.maxDelivered = action.eventId
        this.recovery = undefined
        this.rank.discardRecoveryBeforeClear()
        this.admitted.push(...action.group.events)
        this.rank.commitLiveAdmission(action.eventId)
        break
      case "Recover":
        if (action.reset) {
          this.recovery = undefined
          this.admitted = []
        }
        this.recovery = { start: action.startEventId, answered: undefined }
        break
      case "ResetDegraded":
        throw new Error("a recoverable source never degrades on a gap")
    }
    // While in flight nothing but a clear reaches the target from the live path.
    if (wasInflight && action._tag !== "Clear") expect(this.admitted.length).toBe(before)
  }

  answer(): void {
    if (this.recovery !== undefined && this.recovery.answered === undefined) {
      this.recovery.answered = { watermark: this.truth.length }
    }
  }

  complete(): void {
    const recovery = this.recovery
    if (recovery?.answered === undefined) return
    const watermark = recovery.answered.watermark
    let recovered: Array<RouterEvent>
    let cursor: number
    if (recovery.start === undefined) {
      // TreeDump: replace the rank with the true history through the watermark.
      this.admitted = this.truth.slice(0, watermark).flatMap((group) => group.events)
      recovered = []
      cursor = watermark
    } else {
      expect(recovery.start).toBeLessThanOrEqual(watermark)
      recovered = this.truth.slice(recovery.start - 1, watermark).flatMap((group) => group.events)
      cursor = Math.max(this.rank.lastAdmittedId() ?? 0, watermark)
    }
    const after = this.rank.clone()
    after.beginSuccessfulRecoveryDrain(cursor)
    const plan = after.planPendingDrain()
    this.admitted.push(...recovered, ...plan.events)
    after.commitPendingDrain(plan.cursor, plan.nextRecoveryStart)
    this.rank = after
    this.recovery =
      plan.nextRecoveryStart === undefined
        ? undefined
        : { start: plan.nextRecoveryStart, answered: undefined }
  }

  check(withClears: boolean): void {
    if (this.rank.recoveryInflight) return
    expect(this.recovery).toBeUndefined()
    const cursor = this.rank.lastAdmittedId() ?? 0
    // Nothing delivered is left behind once the rank is live again (max_seen loss detection).
    expect(cursor).toBeGreaterThanOrEqual(this.maxDelivered)
    const expected = this.truth.slice(0, cursor).flatMap((group) => group.events)
    if (withClears) expect(fold(this.admitted)).toEqual(fold(expected))
    else expect(ids(this.admitted)).toEqual(ids(expected))
  }
}

const opArbitrary: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 80,
    arbitrary: fc.integer({ min: 0, max: 2 }).map((copies): Op => ({ _tag: "Produce", copies }))
  },
  { weight: 100, arbitrary: fc.nat().map((pick): Op => ({ _tag: "Deliver", pick })) },
  { weight: 20, arbitrary: fc.constant<Op>({ _tag: "Answer" }) },
  { weight: 20, arbitrary: fc.constant<Op>({ _tag: "Complete" }) },
  {
    weight: 4,
    arbitrary: fc.integer({ min: 1000, max: 1100 }).map((size): Op => ({ _tag: "Burst", size }))
  }
)

const runModel = (ops: ReadonlyArray<Op>, sizes: ReadonlyArray<number>, kinds: ReadonlyArray<number>) => {
  const withClears = kinds.includes(0)
  const model = new Model(sizes, kinds)
  for (const op of ops) {
    if (op._tag === "Produce") model.produce(op.copies)
    else if (op._tag === "Deliver") model.deliver(op.pick)
    else if (op._tag === "Answer") model.answer()
    else if (op._tag === "Burst") model.burst(op.size)
    else model.complete()
    model.check(withClears)
  }
  // Quiesce: a reliably delivered final batch reveals any trailing loss; then every recovery runs.
  while (model.network.length > 0) model.deliver(0)
  model.produce(1)
  model.deliver(0)
  for (let i = 0; i < 64 && model.recovery !== undefined; i++) {
    model.answer()
    model.complete()
  }
  expect(model.recovery).toBeUndefined()
  model.check(withClears)
  expect(model.rank.lastAdmittedId()).toBe(model.truth.length)
  const all = model.truth.flatMap((group) => group.events)
  if (withClears) expect(fold(model.admitted)).toEqual(fold(all))
  else expect(ids(model.admitted)).toEqual(ids(all))
}

describe("RankState against a model of the true history", () => {
  it("admits the true sequence without gaps or duplicates after every completed recovery", () => {
    fc.assert(
      fc.property(
        fc.array(opArbitrary, { maxLength: 300 }),
        fc.array(fc.integer({ min: 1, max: 3 }), { minLength: 1, maxLength: 5 }),
        (ops, sizes) => runModel(ops, sizes, [2])
      ),
      { numRuns: 300 }
    )
  })

  it("converges to the true rank state with removals and rank clears in the history", () => {
    fc.assert(
      fc.property(
        fc.array(opArbitrary, { maxLength: 300 }),
        fc.array(fc.integer({ min: 1, max: 3 }), { minLength: 1, maxLength: 5 }),
        fc.array(fc.integer({ min: 0, max: 6 }), { minLength: 1, maxLength: 7 }),
        (ops, sizes, kinds) => runModel(ops, sizes, kinds)
      ),
      { numRuns: 300 }
    )
  })
})

describe("RankState.appliesLive (the live hot path's check)", () => {
  it("is true exactly when observeLiveGroup answers Apply, and observes nothing", () => {
    fc.assert(
      fc.property(
        fc.option(fc.integer({ min: 0, max: 6 }), { nil: undefined }),
        fc.boolean(),
        fc.integer({ min: 1, max: 8 }),
        fc.integer({ min: 1, max: 3 }),
        fc.boolean(),
        fc.boolean(),
        fc.boolean(),
        fc.boolean(),
        (cursor, inflight, id, size, withClear, recoverable, incrementalGaps, restartsAtFirstId) => {
          const rank = inflight ? inflightAt(cursor) : liveAt(cursor)
          const events = Array.from({ length: size }, (_, j) =>
            withClear && j === size - 1 ? clear(id) : store(id, id * 10 + j)
          )
          const group: CommitGroup = { eventId: id, events }
          const before = rank.clone()
          const applies = rank.appliesLive(id, withClear, recoverable)
          // Pure: the state is what it was.
          expect(rank).toEqual(before)
          const action = before.observeLiveGroup(group, recoverable, incrementalGaps, restartsAtFirstId)
          expect(applies).toBe(action._tag === "Apply")
        }
      ),
      { numRuns: 2000 }
    )
  })
})
