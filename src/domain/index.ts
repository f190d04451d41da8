/**
 * The domain layer: identity derivation, model registrations and pool descriptors, KV events and
 * the JSON codecs of everything that crosses a process boundary.
 */

export {
  CacheSemanticsId,
  DcCkfFormatIdentity,
  DcId,
  type IdentitySource,
  IndexerDomainId,
  LaneLease,
  PoolId,
  ProducerIdentity,
  RoutingScopeId
} from "../ckf/identity.js"
export * from "./events.js"
export * from "./identity.js"
export * from "./json.js"
export * from "./model.js"
export { compareUtf8, hasSurroundingWhitespace, isWellFormedUnicode, utf8Length } from "./text.js"
