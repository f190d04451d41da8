/**
 * The membership watch loop (relay-service.md §2.6): follows `Discovery` snapshots, projects
 * them incrementally and publishes a new `DcMembershipView` only when some endpoint's membership
 * changed. Soft discovery errors are logged once while they persist. The loop is supervised: after
 * a defect it resubscribes, and the latest snapshot comes first.
 */

import { Effect, type Scope, Stream, SubscriptionRef } from "effect"
import { loopStep, supervised } from "../observability/Supervised.js"
import { Discovery, type DiscoverySnapshot } from "./Discovery.js"
import type { DiscoveryScope } from "./DiscoveryConfig.js"
import type { DcMembershipView } from "./Membership.js"
import { MembershipProjector, type MembershipUpdate } from "./MembershipProjection.js"

interface MembershipWatchShape {
  readonly current: Effect.Effect<DcMembershipView>
  /** The current view, then every changed view. */
  readonly changes: Stream.Stream<DcMembershipView>
}

const project = (
  projector: MembershipProjector,
  snapshot: DiscoverySnapshot
): Effect.Effect<MembershipUpdate> =>
  Effect.sync(() => projector.apply(snapshot.cards)).pipe(
    Effect.tap((update) =>
      Effect.forEach(
        update.reported,
        (diagnostic) =>
          diagnostic.endpoint.length > 0
            ? Effect.logWarning(diagnostic.message).pipe(Effect.annotateLogs("endpoint", diagnostic.endpoint))
            : Effect.logWarning(diagnostic.message),
        { discard: true }
      )
    ),
    Effect.tap((update) =>
      update.viewChanged
        ? Effect.logDebug("membership view changed").pipe(
            Effect.annotateLogs({
              revision: String(snapshot.revision),
              changed: update.changed.length,
              removed: update.removed.length,
              endpoints: update.view.endpoints.size
            })
          )
        : Effect.void
    ),
    Effect.withSpan("discovery.membership.project", {
      attributes: {
        "discovery.revision": String(snapshot.revision),
        "discovery.cards": snapshot.cards.length
      }
    })
  )

/** The membership view of the discovery in context, kept up to date for the scope's life. */
export const makeMembershipWatch = (
  scope: DiscoveryScope
): Effect.Effect<MembershipWatchShape, never, Discovery | Scope.Scope> =>
  Effect.gen(function* () {
    const discovery = yield* Discovery
    const projector = new MembershipProjector(scope)
    const initial = yield* project(projector, yield* discovery.current)
    const ref = yield* SubscriptionRef.make(initial.view)
    yield* discovery.changes.pipe(
      Stream.runForEach((snapshot) =>
        loopStep("discovery.membership").pipe(
          Effect.zipRight(project(projector, snapshot)),
          Effect.flatMap((update) =>
            update.viewChanged ? SubscriptionRef.set(ref, update.view) : Effect.void
          )
        )
      ),
      (loop) => supervised("discovery.membership", loop),
      Effect.forkScoped
    )
    return { current: SubscriptionRef.get(ref), changes: ref.changes }
  }).pipe(Effect.annotateLogs("component", "membership-watch"))
