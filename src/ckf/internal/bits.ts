/** Bit tricks over u32 masks, shared by the filter search and the worker query. */

/** Index of the lowest set bit of a non-zero mask. */
export const lowestBit = (mask: number): number => 31 - Math.clz32(mask & -mask)

/** Bits set in a u32. */
export const popcount = (mask: number): number => {
  let v = mask - ((mask >>> 1) & 0x5555_5555)
  v = (v & 0x3333_3333) + ((v >>> 2) & 0x3333_3333)
  return (Math.imul((v + (v >>> 4)) & 0x0f0f_0f0f, 0x0101_0101) >>> 24) & 0xff
}
