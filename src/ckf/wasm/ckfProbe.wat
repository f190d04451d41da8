;; The global consumer's prefix search on WebAssembly (src/ckf/probeWasm.ts; the §8.2 search of
;; src/ckf/global.ts `laneDepth`): per query position the CKF addressing of its block hash (XXH3-64
;; of the 8 little-endian bytes, fingerprint, buckets a and b, as src/ckf/addressing.ts) and the
;; hit bit of every lane from the two 128-byte rows of the transposed table, with SIMD; and the
;; search of all lanes in lock-step over those bits.
;;
;; Source of truth for src/ckf/ckfProbeWasm.generated.ts (`npm run build:wasm` assembles it with
;; wabt; the tests check the committed bytes against a fresh build). Uses 128-bit SIMD.
;;
;; Memory layout (one exported memory, grown once by the caller and never again):
;;   [1024, 66560)     per query position, 0 until probed, then 0x10000 | the lanes' hit mask
;;   [66560, 197632)   the query's block hashes, [hi, lo] u32 pairs (16384 positions)
;;   [197632, 197888)  per lane (16 x u32 each): lower bound, its predecessor, upper bound, depth
;;   [197888, 197908)  the last search's counters: probes, lane tests, left-edge lanes,
;;                     activated lanes, provenance skips
;;   [262144, ...)     the transposed table: per bucket 16 lanes x one u64 word = 128 bytes
(module
  (memory (export "memory") 1)

  ;; XXH3's 4..8-byte bitflip of the format's seed, and the bucket mask.
  (global $bitflip (mut i64) (i64.const 0))
  (global $mask (mut i32) (i32.const 0))
  ;; XXH3's 1..3-byte bitflip of the alternate-bucket seed (seed ^ GOLDEN).
  (global $bitflip2 (mut i64) (i64.const 0))
  ;; Counters of the search in progress.
  (global $probes (mut i32) (i32.const 0))
  (global $tests (mut i32) (i32.const 0))
  (global $leftEdge (mut i32) (i32.const 0))
  (global $activated (mut i32) (i32.const 0))
  (global $skips (mut i32) (i32.const 0))

  (func $init (export "init") (param $bfHi i32) (param $bfLo i32) (param $mask i32) (param $bf2Hi i32)
    (param $bf2Lo i32)
    (global.set $bitflip2
      (i64.or (i64.shl (i64.extend_i32_u (local.get $bf2Hi)) (i64.const 32))
        (i64.extend_i32_u (local.get $bf2Lo))))
    (global.set $bitflip
      (i64.or (i64.shl (i64.extend_i32_u (local.get $bfHi)) (i64.const 32))
        (i64.extend_i32_u (local.get $bfLo))))
    (global.set $mask (local.get $mask)))

  ;; Hit mask (bit = lane) of position $pos, whose hash is at 66560 + 8 pos.
  (func $probeAt (export "probeAt") (param $pos i32) (result i32)
    (local $h i64) (local $fp i32) (local $a i32)
    (local $ra i32) (local $rb i32) (local $rep v128)
    (local $v0 v128) (local $v1 v128) (local $v2 v128) (local $v3 v128)
    ;; The pair [hi, lo] read as one little-endian u64 is XXH3's input64 = lo << 32 | hi.
    (local $d i64) (local $delta i32)
    (local.set $h (i64.xor (i64.load offset=66560 (i32.shl (local.get $pos) (i32.const 3)))
      (global.get $bitflip)))
    ;; rrmxmx(input64 ^ bitflip, 8)
    (local.set $h (i64.xor (local.get $h)
      (i64.xor (i64.rotl (local.get $h) (i64.const 49)) (i64.rotl (local.get $h) (i64.const 24)))))
    (local.set $h (i64.mul (local.get $h) (i64.const 0x9fb21c651e98df25)))
    (local.set $h (i64.xor (local.get $h)
      (i64.add (i64.shr_u (local.get $h) (i64.const 35)) (i64.const 8))))
    (local.set $h (i64.mul (local.get $h) (i64.const 0x9fb21c651e98df25)))
    (local.set $h (i64.xor (local.get $h) (i64.shr_u (local.get $h) (i64.const 28))))
    ;; fingerprint = low 16 bits (0 -> 1); a = bits 16.. under the mask; b = a ^ delta(fp)
    (local.set $fp (i32.and (i32.wrap_i64 (local.get $h)) (i32.const 0xffff)))
    (local.set $fp (select (local.get $fp) (i32.const 1) (local.get $fp)))
    (local.set $a (i32.and (i32.wrap_i64 (i64.shr_u (local.get $h) (i64.const 16))) (global.get $mask)))
    (local.set $ra (i32.shl (local.get $a) (i32.const 7)))
    ;; delta(fp) = XXH3(LE16(fp), seed ^ GOLDEN) & mask (0 -> 1): the 1..3-byte path, combined =
    ;; c1 << 16 | c2 << 24 | c3 | len << 8 with c3 = c2 for two bytes, then XXH64's avalanche.
    (local.set $d (i64.xor (global.get $bitflip2) (i64.extend_i32_u
      (i32.or
        (i32.or (i32.shl (i32.and (local.get $fp) (i32.const 0xff)) (i32.const 16))
          (i32.shl (i32.shr_u (local.get $fp) (i32.const 8)) (i32.const 24)))
        (i32.or (i32.shr_u (local.get $fp) (i32.const 8)) (i32.const 0x200))))))
    (local.set $d (i64.xor (local.get $d) (i64.shr_u (local.get $d) (i64.const 33))))
    (local.set $d (i64.mul (local.get $d) (i64.const 0xc2b2ae3d27d4eb4f)))
    (local.set $d (i64.xor (local.get $d) (i64.shr_u (local.get $d) (i64.const 29))))
    (local.set $d (i64.mul (local.get $d) (i64.const 0x165667b19e3779f9)))
    (local.set $delta (i32.and (i32.wrap_i64 (i64.xor (local.get $d) (i64.shr_u (local.get $d) (i64.const 32))))
      (global.get $mask)))
    (local.set $delta (select (local.get $delta) (i32.const 1) (local.get $delta)))
    (local.set $rb (i32.shl (i32.xor (local.get $a) (local.get $delta)) (i32.const 7)))
    (local.set $rep (i16x8.splat (local.get $fp)))
    ;; Per 16 bytes (two lanes' words, four slots each): slots equal to the fingerprint in a or b.
    ;; The fingerprint is never 0, so an empty slot never matches.
    ;; Lanes 0..3
    (local.set $v0 (v128.or
      (i16x8.eq (v128.load offset=262144 (local.get $ra)) (local.get $rep))
      (i16x8.eq (v128.load offset=262144 (local.get $rb)) (local.get $rep))))
    (local.set $v1 (v128.or
      (i16x8.eq (v128.load offset=262160 (local.get $ra)) (local.get $rep))
      (i16x8.eq (v128.load offset=262160 (local.get $rb)) (local.get $rep))))
    ;; Narrowing keeps the order: lane l's four slots become bytes 4l..4l+3, one i32 per lane.
    (local.set $v0 (i32x4.ne (i8x16.narrow_i16x8_s (local.get $v0) (local.get $v1)) (v128.const i64x2 0 0)))
    ;; Lanes 4..7
    (local.set $v2 (v128.or
      (i16x8.eq (v128.load offset=262176 (local.get $ra)) (local.get $rep))
      (i16x8.eq (v128.load offset=262176 (local.get $rb)) (local.get $rep))))
    (local.set $v3 (v128.or
      (i16x8.eq (v128.load offset=262192 (local.get $ra)) (local.get $rep))
      (i16x8.eq (v128.load offset=262192 (local.get $rb)) (local.get $rep))))
    (local.set $v1 (i32x4.ne (i8x16.narrow_i16x8_s (local.get $v2) (local.get $v3)) (v128.const i64x2 0 0)))
    ;; Lanes 0..7, one i16 each
    (local.set $v0 (i16x8.narrow_i32x4_s (local.get $v0) (local.get $v1)))
    ;; Lanes 8..11
    (local.set $v2 (v128.or
      (i16x8.eq (v128.load offset=262208 (local.get $ra)) (local.get $rep))
      (i16x8.eq (v128.load offset=262208 (local.get $rb)) (local.get $rep))))
    (local.set $v3 (v128.or
      (i16x8.eq (v128.load offset=262224 (local.get $ra)) (local.get $rep))
      (i16x8.eq (v128.load offset=262224 (local.get $rb)) (local.get $rep))))
    (local.set $v1 (i32x4.ne (i8x16.narrow_i16x8_s (local.get $v2) (local.get $v3)) (v128.const i64x2 0 0)))
    ;; Lanes 12..15
    (local.set $v2 (v128.or
      (i16x8.eq (v128.load offset=262240 (local.get $ra)) (local.get $rep))
      (i16x8.eq (v128.load offset=262240 (local.get $rb)) (local.get $rep))))
    (local.set $v3 (v128.or
      (i16x8.eq (v128.load offset=262256 (local.get $ra)) (local.get $rep))
      (i16x8.eq (v128.load offset=262256 (local.get $rb)) (local.get $rep))))
    (local.set $v2 (i32x4.ne (i8x16.narrow_i16x8_s (local.get $v2) (local.get $v3)) (v128.const i64x2 0 0)))
    ;; Lanes 8..15, then all 16 lanes one byte each, then one bit each
    (local.set $v1 (i16x8.narrow_i32x4_s (local.get $v1) (local.get $v2)))
    (i8x16.bitmask (i8x16.narrow_i16x8_s (local.get $v0) (local.get $v1))))

  ;; The hit mask of $pos in this query, probed on its first use (bit 16 marks it probed).
  (func $hit (param $pos i32) (result i32)
    (local $m i32)
    (local.set $m (i32.load offset=1024 (i32.shl (local.get $pos) (i32.const 2))))
    (if (i32.eqz (local.get $m))
      (then
        (local.set $m (i32.or (call $probeAt (local.get $pos)) (i32.const 0x10000)))
        (i32.store offset=1024 (i32.shl (local.get $pos) (i32.const 2)) (local.get $m))
        (global.set $probes (i32.add (global.get $probes) (i32.const 1)))))
    (local.get $m))

  ;; Probes $pos, not yet probed in this query, and records its mask.
  (func $fill (param $pos i32)
    (i32.store offset=1024 (i32.shl (local.get $pos) (i32.const 2))
      (i32.or (call $probeAt (local.get $pos)) (i32.const 0x10000)))
    (global.set $probes (i32.add (global.get $probes) (i32.const 1))))

  ;; One lane's test of $pos ($bit or 0), counted.
  (func $test (param $pos i32) (param $bit i32) (result i32)
    (global.set $tests (i32.add (global.get $tests) (i32.const 1)))
    (i32.and (call $hit (local.get $pos)) (local.get $bit)))

  ;; The end of `laneDepth` for $lane from its final bounds: the verification scan of the window
  ;; below $upper (the known hit $lower skipped), and the fallback rescan after $pred.
  (func $verify (param $upper i32) (param $lower i32) (param $pred i32) (param $window i32) (param $bit i32)
    (result i32)
    (local $start i32) (local $pos i32)
    (local.set $start (select (i32.sub (local.get $upper) (local.get $window)) (i32.const 0)
      (i32.gt_u (local.get $upper) (local.get $window))))
    (local.set $pos (local.get $start))
    (block $scanned
      (loop $scan
        (br_if $scanned (i32.ge_u (local.get $pos) (local.get $upper)))
        (if (i32.ne (local.get $pos) (local.get $lower))
          (then
            ;; The window was probed before the lanes' scans (the search's last phase).
            (global.set $tests (i32.add (global.get $tests) (i32.const 1)))
            (if (i32.eqz (i32.and (i32.load offset=1024 (i32.shl (local.get $pos) (i32.const 2))) (local.get $bit)))
              (then
                (if (i32.gt_u (local.get $pos) (local.get $start)) (then (return (local.get $pos))))
                ;; A miss at the window's left edge.
                (global.set $leftEdge (i32.add (global.get $leftEdge) (i32.const 1)))
                (if (i32.ge_u (local.get $pred) (local.get $start))
                  (then
                    (global.set $skips (i32.add (global.get $skips) (i32.const 1)))
                    (return (local.get $pos))))
                (if (i32.eq (i32.add (local.get $pred) (i32.const 1)) (local.get $start))
                  (then (return (local.get $start))))
                (global.set $activated (i32.add (global.get $activated) (i32.const 1)))
                (local.set $pos (i32.add (local.get $pred) (i32.const 1)))
                (block $rescanned
                  (loop $rescan
                    (br_if $rescanned (i32.ge_u (local.get $pos) (local.get $start)))
                    (if (i32.eqz (call $test (local.get $pos) (local.get $bit)))
                      (then (return (local.get $pos))))
                    (local.set $pos (i32.add (local.get $pos) (i32.const 1)))
                    (br $rescan)))
                (return (local.get $start))))))
        (local.set $pos (i32.add (local.get $pos) (i32.const 1)))
        (br $scan)))
    (local.get $upper))

  ;; Every lane of $captured's depth for the $n positions at 66560 (n <= 16384) into 197824 +
  ;; 4 lane (0 for the others), the counters into 197888; returns the lanes that hit position 0.
  ;; The lanes run in lock-step: each phase first probes every position its lanes will test
  ;; (galloping: the powers of two, the same for every lane; a binary round: each open lane's
  ;; midpoint; verification: each lane's window), so that their cache misses overlap, then moves
  ;; every lane on the bits. Each lane tests exactly the positions of `laneDepth`, in its order.
  (func $search (export "search") (param $n i32) (param $captured i32) (param $window i32) (result i32)
    (local $p i32) (local $end i32) (local $active i32) (local $open i32) (local $m i32)
    (local $lane i32) (local $bit i32) (local $at i32) (local $pos i32)
    (local $lo i32) (local $pr i32) (local $up i32) (local $mid i32) (local $t i32)
    (global.set $probes (i32.const 0))
    (global.set $tests (i32.const 0))
    (global.set $leftEdge (i32.const 0))
    (global.set $activated (i32.const 0))
    (global.set $skips (i32.const 0))
    ;; Depths start at 0.
    (v128.store offset=197824 (i32.const 0) (v128.const i64x2 0 0))
    (v128.store offset=197840 (i32.const 0) (v128.const i64x2 0 0))
    (v128.store offset=197856 (i32.const 0) (v128.const i64x2 0 0))
    (v128.store offset=197872 (i32.const 0) (v128.const i64x2 0 0))
    ;; No position of this query is probed yet (4 at a time; the region holds a multiple of 4).
    (local.set $p (i32.const 1024))
    (local.set $end (i32.add (i32.const 1024) (i32.shl (local.get $n) (i32.const 2))))
    (block $cleared
      (loop $clear
        (br_if $cleared (i32.ge_u (local.get $p) (local.get $end)))
        (v128.store (local.get $p) (v128.const i64x2 0 0))
        (local.set $p (i32.add (local.get $p) (i32.const 16)))
        (br $clear)))
    (block $searched
      (br_if $searched (i32.eqz (local.get $n)))
      ;; A lane that misses position 0 has depth 0.
      (global.set $tests (i32.popcnt (local.get $captured)))
      (local.set $active (i32.and (local.get $captured) (call $hit (i32.const 0))))
      (br_if $searched (i32.eqz (local.get $active)))
      ;; Galloping: probe every power of two below n, then each lane samples until its first miss.
      (local.set $pos (i32.const 1))
      (block $probed
        (loop $gallopProbe
          (br_if $probed (i32.ge_u (local.get $pos) (local.get $n)))
          (if (i32.eqz (i32.load offset=1024 (i32.shl (local.get $pos) (i32.const 2))))
            (then (call $fill (local.get $pos))))
          (local.set $pos (i32.shl (local.get $pos) (i32.const 1)))
          (br $gallopProbe)))
      (local.set $m (local.get $active))
      (loop $gallopLanes
        (local.set $lane (i32.ctz (local.get $m)))
        (local.set $bit (i32.shl (i32.const 1) (local.get $lane)))
        (local.set $at (i32.shl (local.get $lane) (i32.const 2)))
        (local.set $lo (i32.const 0))
        (local.set $pr (i32.const 0))
        (local.set $up (local.get $n))
        (local.set $pos (i32.const 1))
        (block $missed
          (loop $sample
            (br_if $missed (i32.ge_u (local.get $pos) (local.get $n)))
            (local.set $t (i32.add (local.get $t) (i32.const 1)))
            (if (i32.eqz (i32.and (i32.load offset=1024 (i32.shl (local.get $pos) (i32.const 2))) (local.get $bit)))
              (then
                (local.set $up (local.get $pos))
                (br $missed)))
            (local.set $pr (local.get $lo))
            (local.set $lo (local.get $pos))
            (local.set $pos (i32.shl (local.get $pos) (i32.const 1)))
            (br $sample)))
        (i32.store offset=197632 (local.get $at) (local.get $lo))
        (i32.store offset=197696 (local.get $at) (local.get $pr))
        (i32.store offset=197760 (local.get $at) (local.get $up))
        (if (i32.gt_u (i32.sub (local.get $up) (local.get $lo)) (i32.const 1))
          (then (local.set $open (i32.or (local.get $open) (local.get $bit)))))
        (local.set $m (i32.and (local.get $m) (i32.sub (local.get $m) (i32.const 1))))
        (br_if $gallopLanes (local.get $m)))
      ;; Binary rounds: probe every open lane's midpoint, then move each lane.
      (block $bisected
        (loop $round
          (br_if $bisected (i32.eqz (local.get $open)))
          (local.set $m (local.get $open))
          (loop $probeMids
            (local.set $at (i32.shl (i32.ctz (local.get $m)) (i32.const 2)))
            (local.set $lo (i32.load offset=197632 (local.get $at)))
            (local.set $up (i32.load offset=197760 (local.get $at)))
            (local.set $mid (i32.add (local.get $lo)
              (i32.shr_u (i32.sub (local.get $up) (local.get $lo)) (i32.const 1))))
            (if (i32.eqz (i32.load offset=1024 (i32.shl (local.get $mid) (i32.const 2))))
              (then (call $fill (local.get $mid))))
            (local.set $m (i32.and (local.get $m) (i32.sub (local.get $m) (i32.const 1))))
            (br_if $probeMids (local.get $m)))
          (local.set $m (local.get $open))
          (loop $moveLanes
            (local.set $lane (i32.ctz (local.get $m)))
            (local.set $bit (i32.shl (i32.const 1) (local.get $lane)))
            (local.set $at (i32.shl (local.get $lane) (i32.const 2)))
            (local.set $lo (i32.load offset=197632 (local.get $at)))
            (local.set $up (i32.load offset=197760 (local.get $at)))
            (local.set $mid (i32.add (local.get $lo)
              (i32.shr_u (i32.sub (local.get $up) (local.get $lo)) (i32.const 1))))
            (local.set $t (i32.add (local.get $t) (i32.const 1)))
            (if (i32.and (i32.load offset=1024 (i32.shl (local.get $mid) (i32.const 2))) (local.get $bit))
              (then
                (i32.store offset=197696 (local.get $at) (local.get $lo))
                (local.set $lo (local.get $mid))
                (i32.store offset=197632 (local.get $at) (local.get $mid)))
              (else
                (local.set $up (local.get $mid))
                (i32.store offset=197760 (local.get $at) (local.get $mid))))
            (if (i32.le_u (i32.sub (local.get $up) (local.get $lo)) (i32.const 1))
              (then (local.set $open (i32.xor (local.get $open) (local.get $bit)))))
            (local.set $m (i32.and (local.get $m) (i32.sub (local.get $m) (i32.const 1))))
            (br_if $moveLanes (local.get $m)))
          (br $round)))
      (global.set $tests (i32.add (global.get $tests) (local.get $t)))
      ;; Verification: probe every lane's window, then scan each lane's.
      (local.set $m (local.get $active))
      (loop $probeWindows
        (local.set $at (i32.shl (i32.ctz (local.get $m)) (i32.const 2)))
        (local.set $up (i32.load offset=197760 (local.get $at)))
        (local.set $pos (select (i32.sub (local.get $up) (local.get $window)) (i32.const 0)
          (i32.gt_u (local.get $up) (local.get $window))))
        (block $windowProbed
          (loop $probeWindow
            (br_if $windowProbed (i32.ge_u (local.get $pos) (local.get $up)))
            (if (i32.eqz (i32.load offset=1024 (i32.shl (local.get $pos) (i32.const 2))))
              (then (call $fill (local.get $pos))))
            (local.set $pos (i32.add (local.get $pos) (i32.const 1)))
            (br $probeWindow)))
        (local.set $m (i32.and (local.get $m) (i32.sub (local.get $m) (i32.const 1))))
        (br_if $probeWindows (local.get $m)))
      (local.set $m (local.get $active))
      (loop $verifyLanes
        (local.set $lane (i32.ctz (local.get $m)))
        (local.set $at (i32.shl (local.get $lane) (i32.const 2)))
        (i32.store offset=197824 (local.get $at)
          (call $verify
            (i32.load offset=197760 (local.get $at))
            (i32.load offset=197632 (local.get $at))
            (i32.load offset=197696 (local.get $at))
            (local.get $window)
            (i32.shl (i32.const 1) (local.get $lane))))
        (local.set $m (i32.and (local.get $m) (i32.sub (local.get $m) (i32.const 1))))
        (br_if $verifyLanes (local.get $m))))
    (i32.store offset=197888 (i32.const 0) (global.get $probes))
    (i32.store offset=197892 (i32.const 0) (global.get $tests))
    (i32.store offset=197896 (i32.const 0) (global.get $leftEdge))
    (i32.store offset=197900 (i32.const 0) (global.get $activated))
    (i32.store offset=197904 (i32.const 0) (global.get $skips))
    (local.get $active))
)
