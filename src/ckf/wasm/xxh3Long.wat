;; XXH3-64, unseeded, default secret, for inputs longer than 240 bytes: the CBI1 body checksum.
;;
;; Source of truth for src/ckf/xxh3Wasm.generated.ts (`npm run build:wasm` assembles it with
;; wabt; test/ckf/xxh3Wasm.test.ts checks the committed bytes against a fresh build).
;;
;; The long path needs 32x32->64 multiplies, which JavaScript lacks and wasm SIMD has
;; (i64x2.extmul_low_i32x4_u). The eight 64-bit accumulators live in four v128 values: vector j
;; holds acc[2j] (lane 0) and acc[2j+1] (lane 1), so "acc[i ^ 1] += data" is a lane swap.
;;
;; A hash is "reset", then "blocks" over pieces of whole 1024-byte blocks, then "finish" over
;; the last block, so the caller copies a large input in through a cache-sized window.
;;
;; Memory layout (one exported memory, grown by the caller):
;;   [0, 192)    the default secret (data segment below)
;;   [192, 200)  the last 64-bit result, little-endian
;;   [256, ...)  the caller's input window
(module
  (memory (export "memory") 1)

  (data (i32.const 0)
    "\b8\fe\6c\39\23\a4\4b\be\7c\01\81\2c\f7\21\ad\1c\de\d4\6d\e9\83\90\97\db\72\40\a4\a4\b7\b3\67\1f"
    "\cb\79\e6\4e\cc\c0\e5\78\82\5a\d0\7d\cc\ff\72\21\b8\08\46\74\f7\43\24\8e\e0\35\90\e6\81\3a\26\4c"
    "\3c\28\52\bb\91\c3\00\cb\88\d0\65\8b\1b\53\2e\a3\71\64\48\97\a2\0d\f9\4e\38\19\ef\46\a9\de\ac\d8"
    "\a8\fa\76\3f\e3\9c\34\3f\f9\dc\bb\c7\c7\0b\4f\1d\8a\51\e0\4b\cd\b4\59\31\c8\9f\7e\c9\d9\78\73\64"
    "\ea\c5\ac\83\34\d3\eb\c3\c5\81\a0\ff\fa\13\63\eb\17\0d\dd\51\b7\f0\da\49\d3\16\55\26\29\d4\68\9e"
    "\2b\16\be\58\7d\47\a1\fc\8f\f8\b8\d1\7a\d0\31\ce\45\cb\3a\8f\95\16\04\28\af\d7\fb\ca\bb\4b\40\7e")

  ;; Low 64 bits XOR high 64 bits of the 128-bit product a * b, from four 32x32 products.
  (func $mul128fold (param $a i64) (param $b i64) (result i64)
    (local $alo i64) (local $ahi i64) (local $blo i64) (local $bhi i64)
    (local $lolo i64) (local $hilo i64) (local $cross i64)
    (local.set $alo (i64.and (local.get $a) (i64.const 0xffffffff)))
    (local.set $ahi (i64.shr_u (local.get $a) (i64.const 32)))
    (local.set $blo (i64.and (local.get $b) (i64.const 0xffffffff)))
    (local.set $bhi (i64.shr_u (local.get $b) (i64.const 32)))
    (local.set $lolo (i64.mul (local.get $alo) (local.get $blo)))
    (local.set $hilo (i64.mul (local.get $ahi) (local.get $blo)))
    ;; cross = (lolo >> 32) + (hilo & 0xffffffff) + alo * bhi, which cannot overflow 64 bits
    (local.set $cross
      (i64.add
        (i64.add (i64.shr_u (local.get $lolo) (i64.const 32)) (i64.and (local.get $hilo) (i64.const 0xffffffff)))
        (i64.mul (local.get $alo) (local.get $bhi))))
    (i64.xor
      ;; low half
      (i64.or (i64.shl (local.get $cross) (i64.const 32)) (i64.and (local.get $lolo) (i64.const 0xffffffff)))
      ;; high half
      (i64.add
        (i64.add (i64.shr_u (local.get $hilo) (i64.const 32)) (i64.shr_u (local.get $cross) (i64.const 32)))
        (i64.mul (local.get $ahi) (local.get $bhi)))))

  ;; The merge term for accumulators (x, y) against the secret at $s.
  (func $mergePair (param $acc v128) (param $s i32) (result i64)
    (call $mul128fold
      (i64.xor (i64x2.extract_lane 0 (local.get $acc)) (i64.load (local.get $s)))
      (i64.xor (i64x2.extract_lane 1 (local.get $acc)) (i64.load offset=8 (local.get $s)))))

  ;; The eight accumulators between calls, as in the locals of "blocks" and "finish".
  (global $g0 (mut v128) (v128.const i64x2 0 0))
  (global $g1 (mut v128) (v128.const i64x2 0 0))
  (global $g2 (mut v128) (v128.const i64x2 0 0))
  (global $g3 (mut v128) (v128.const i64x2 0 0))

  ;; Starts a hash: the accumulators take XXH3's initial values.
  (func $reset (export "reset")
    (global.set $g0 (v128.const i64x2 0xc2b2ae3d 0x9e3779b185ebca87))
    (global.set $g1 (v128.const i64x2 0xc2b2ae3d27d4eb4f 0x165667b19e3779f9))
    (global.set $g2 (v128.const i64x2 0x85ebca77c2b2ae63 0x85ebca77))
    (global.set $g3 (v128.const i64x2 0x27d4eb2f165667c5 0x9e3779b1)))

  ;; Folds $n whole 1024-byte blocks at $p into the accumulators: 16 stripes each, the secret
  ;; advancing 8 bytes a stripe, then a scramble. The caller keeps back the input's last block
  ;; (the one holding its final byte) for "finish".
  (func $blocks (export "blocks") (param $p i32) (param $n i32)
    (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128)
    (local $d v128) (local $e v128) (local $k v128) (local $l v128) (local $lo v128) (local $hi v128)
    (local $end i32) (local $s i32)
    (local.set $a0 (global.get $g0))
    (local.set $a1 (global.get $g1))
    (local.set $a2 (global.get $g2))
    (local.set $a3 (global.get $g3))
    (local.set $end (i32.add (local.get $p) (i32.shl (local.get $n) (i32.const 10))))
    (block $blocksDone
      (loop $block
        (br_if $blocksDone (i32.eq (local.get $p) (local.get $end)))
        (local.set $s (i32.const 0))
        (loop $stripe
          ;; The stripe body of $accumulate, inlined: V8 does not inline the call, which halves the speed.
          (local.set $d (v128.load offset=0 align=1 (local.get $p)))
          (local.set $e (v128.load offset=16 align=1 (local.get $p)))
          (local.set $k (v128.xor (local.get $d) (v128.load offset=0 align=1 (local.get $s))))
          (local.set $l (v128.xor (local.get $e) (v128.load offset=16 align=1 (local.get $s))))
          (local.set $lo (i8x16.shuffle 0 1 2 3 8 9 10 11 16 17 18 19 24 25 26 27 (local.get $k) (local.get $l)))
          (local.set $hi (i8x16.shuffle 4 5 6 7 12 13 14 15 20 21 22 23 28 29 30 31 (local.get $k) (local.get $l)))
          (local.set $a0 (i64x2.add (i64x2.add (local.get $a0)
            (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $d) (local.get $d)))
            (i64x2.extmul_low_i32x4_u (local.get $lo) (local.get $hi))))
          (local.set $a1 (i64x2.add (i64x2.add (local.get $a1)
            (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $e) (local.get $e)))
            (i64x2.extmul_high_i32x4_u (local.get $lo) (local.get $hi))))
          (local.set $d (v128.load offset=32 align=1 (local.get $p)))
          (local.set $e (v128.load offset=48 align=1 (local.get $p)))
          (local.set $k (v128.xor (local.get $d) (v128.load offset=32 align=1 (local.get $s))))
          (local.set $l (v128.xor (local.get $e) (v128.load offset=48 align=1 (local.get $s))))
          (local.set $lo (i8x16.shuffle 0 1 2 3 8 9 10 11 16 17 18 19 24 25 26 27 (local.get $k) (local.get $l)))
          (local.set $hi (i8x16.shuffle 4 5 6 7 12 13 14 15 20 21 22 23 28 29 30 31 (local.get $k) (local.get $l)))
          (local.set $a2 (i64x2.add (i64x2.add (local.get $a2)
            (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $d) (local.get $d)))
            (i64x2.extmul_low_i32x4_u (local.get $lo) (local.get $hi))))
          (local.set $a3 (i64x2.add (i64x2.add (local.get $a3)
            (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $e) (local.get $e)))
            (i64x2.extmul_high_i32x4_u (local.get $lo) (local.get $hi))))
          (local.set $p (i32.add (local.get $p) (i32.const 64)))
          (local.set $s (i32.add (local.get $s) (i32.const 8)))
          (br_if $stripe (i32.ne (local.get $s) (i32.const 128))))
        (local.set $a0 (call $scramble (local.get $a0) (i32.const 128)))
        (local.set $a1 (call $scramble (local.get $a1) (i32.const 144)))
        (local.set $a2 (call $scramble (local.get $a2) (i32.const 160)))
        (local.set $a3 (call $scramble (local.get $a3) (i32.const 176)))
        (br $block)))
    (global.set $g0 (local.get $a0))
    (global.set $g1 (local.get $a1))
    (global.set $g2 (local.get $a2))
    (global.set $g3 (local.get $a3)))

  ;; Ends a hash of $total bytes whose last block, $tail bytes (1..1024), is at $p. When $tail is
  ;; under 64 the 64 bytes before $p must be the input's bytes before its last block: the final
  ;; stripe is the input's last 64 bytes. Stores the hash at 192 and returns its low half.
  (func $finish (export "finish") (param $p i32) (param $tail i32) (param $total i32) (result i32)
    (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128)
    (local $last i32) (local $s i32) (local $sEnd i32) (local $h i64)
    (local.set $a0 (global.get $g0))
    (local.set $a1 (global.get $g1))
    (local.set $a2 (global.get $g2))
    (local.set $a3 (global.get $g3))
    (local.set $last (i32.sub (i32.add (local.get $p) (local.get $tail)) (i32.const 64)))

    ;; The last block's whole stripes but the one holding the final byte.
    (local.set $sEnd (i32.shl (i32.shr_u (i32.sub (local.get $tail) (i32.const 1)) (i32.const 6)) (i32.const 3)))
    (local.set $s (i32.const 0))
    (block $tailDone
      (loop $tail
        (br_if $tailDone (i32.eq (local.get $s) (local.get $sEnd)))
        (call $accumulate (local.get $p) (local.get $s)
          (local.get $a0) (local.get $a1) (local.get $a2) (local.get $a3))
        (local.set $a3) (local.set $a2) (local.set $a1) (local.set $a0)
        (local.set $p (i32.add (local.get $p) (i32.const 64)))
        (local.set $s (i32.add (local.get $s) (i32.const 8)))
        (br $tail)))

    ;; The input's last 64 bytes, against the secret at 192 - 64 - 7.
    (call $accumulate (local.get $last) (i32.const 121)
      (local.get $a0) (local.get $a1) (local.get $a2) (local.get $a3))
    (local.set $a3) (local.set $a2) (local.set $a1) (local.set $a0)

    ;; Merge from total * PRIME64_1 against the secret at 11, then XXH3's avalanche.
    (local.set $h
      (i64.add
        (i64.add
          (i64.mul (i64.extend_i32_u (local.get $total)) (i64.const 0x9e3779b185ebca87))
          (i64.add (call $mergePair (local.get $a0) (i32.const 11)) (call $mergePair (local.get $a1) (i32.const 27))))
        (i64.add (call $mergePair (local.get $a2) (i32.const 43)) (call $mergePair (local.get $a3) (i32.const 59)))))
    (local.set $h (i64.xor (local.get $h) (i64.shr_u (local.get $h) (i64.const 37))))
    (local.set $h (i64.mul (local.get $h) (i64.const 0x165667919e3779f9)))
    (local.set $h (i64.xor (local.get $h) (i64.shr_u (local.get $h) (i64.const 32))))
    (i64.store (i32.const 192) (local.get $h))
    (i32.wrap_i64 (local.get $h)))

  ;; One 64-byte stripe at $p against the secret at $s: for each 64-bit lane i,
  ;; acc[i ^ 1] += data[i]; acc[i] += lo32(data[i] ^ key[i]) * hi32(data[i] ^ key[i]).
  ;; Two vectors at a time: one shuffle pair gathers their four low and four high key halves, so
  ;; extmul_low and extmul_high each multiply one vector's two lanes.
  (func $accumulate (param $p i32) (param $s i32)
    (param $a0 v128) (param $a1 v128) (param $a2 v128) (param $a3 v128)
    (result v128 v128 v128 v128)
    (local $d v128) (local $e v128) (local $k v128) (local $l v128) (local $lo v128) (local $hi v128)
    (local.set $d (v128.load offset=0 align=1 (local.get $p)))
    (local.set $e (v128.load offset=16 align=1 (local.get $p)))
    (local.set $k (v128.xor (local.get $d) (v128.load offset=0 align=1 (local.get $s))))
    (local.set $l (v128.xor (local.get $e) (v128.load offset=16 align=1 (local.get $s))))
    (local.set $lo (i8x16.shuffle 0 1 2 3 8 9 10 11 16 17 18 19 24 25 26 27 (local.get $k) (local.get $l)))
    (local.set $hi (i8x16.shuffle 4 5 6 7 12 13 14 15 20 21 22 23 28 29 30 31 (local.get $k) (local.get $l)))
    (local.set $a0 (i64x2.add (i64x2.add (local.get $a0)
      (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $d) (local.get $d)))
      (i64x2.extmul_low_i32x4_u (local.get $lo) (local.get $hi))))
    (local.set $a1 (i64x2.add (i64x2.add (local.get $a1)
      (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $e) (local.get $e)))
      (i64x2.extmul_high_i32x4_u (local.get $lo) (local.get $hi))))
    (local.set $d (v128.load offset=32 align=1 (local.get $p)))
    (local.set $e (v128.load offset=48 align=1 (local.get $p)))
    (local.set $k (v128.xor (local.get $d) (v128.load offset=32 align=1 (local.get $s))))
    (local.set $l (v128.xor (local.get $e) (v128.load offset=48 align=1 (local.get $s))))
    (local.set $lo (i8x16.shuffle 0 1 2 3 8 9 10 11 16 17 18 19 24 25 26 27 (local.get $k) (local.get $l)))
    (local.set $hi (i8x16.shuffle 4 5 6 7 12 13 14 15 20 21 22 23 28 29 30 31 (local.get $k) (local.get $l)))
    (local.set $a2 (i64x2.add (i64x2.add (local.get $a2)
      (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $d) (local.get $d)))
      (i64x2.extmul_low_i32x4_u (local.get $lo) (local.get $hi))))
    (local.set $a3 (i64x2.add (i64x2.add (local.get $a3)
      (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $e) (local.get $e)))
      (i64x2.extmul_high_i32x4_u (local.get $lo) (local.get $hi))))
    (local.get $a0) (local.get $a1) (local.get $a2) (local.get $a3))

  ;; acc ^= acc >> 47; acc ^= secret; acc *= PRIME32_1, for the two lanes of one vector.
  (func $scramble (param $acc v128) (param $s i32) (result v128)
    (i64x2.mul
      (v128.xor
        (v128.xor (local.get $acc) (i64x2.shr_u (local.get $acc) (i32.const 47)))
        (v128.load align=1 (local.get $s)))
      (v128.const i64x2 0x9e3779b1 0x9e3779b1)))
)
