;; XXH3-64 for canonical block addressing (src/ckf/tokens.ts, PROTOCOL §3.3): the local hashes of
;; token blocks (17..128 bytes, seeded) and the sequence-hash chain (16 bytes, seeded).
;;
;; Source of truth for src/ckf/xxh3TokensWasm.generated.ts (`npm run build:wasm` assembles it
;; with wabt; the tests check the committed bytes against a fresh build).
;;
;; Both paths need 64x64->128 products, which JavaScript can only build from 16-bit pieces; wasm
;; has i64.mul. Only the MVP instruction set is used.
;;
;; Memory layout (one exported memory, grown by the caller):
;;   [0, 192)    the default secret (data segment below)
;;   [192, 320)  the seeded keys of the 17..128-byte path: for j = 0..7, at 192 + 16j,
;;               LE64(secret, 16j) + seed and LE64(secret, 16j + 8) - seed ("setSeed")
;;   [1024, ...) the caller's window: token words in, [hi, lo] hash pairs out
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

  ;; XXH3's avalanche.
  (func $avalanche (param $h i64) (result i64)
    (local.set $h (i64.xor (local.get $h) (i64.shr_u (local.get $h) (i64.const 37))))
    (local.set $h (i64.mul (local.get $h) (i64.const 0x165667919e3779f9)))
    (i64.xor (local.get $h) (i64.shr_u (local.get $h) (i64.const 32))))

  ;; A u64 from the [hi, lo] u32 pair at $p (the CKF core's hash-pair layout).
  (func $loadPair (param $p i32) (result i64)
    (i64.or
      (i64.shl (i64.extend_i32_u (i32.load (local.get $p))) (i64.const 32))
      (i64.extend_i32_u (i32.load offset=4 (local.get $p)))))

  ;; Stores $h as a [hi, lo] u32 pair at $p.
  (func $storePair (param $p i32) (param $h i64)
    (i32.store (local.get $p) (i32.wrap_i64 (i64.shr_u (local.get $h) (i64.const 32))))
    (i32.store offset=4 (local.get $p) (i32.wrap_i64 (local.get $h))))

  ;; Sets the seed of "localHashes", given as halves.
  (func $setSeed (export "setSeed") (param $hi i32) (param $lo i32)
    (local $seed i64) (local $j i32)
    (local.set $seed (i64.or (i64.shl (i64.extend_i32_u (local.get $hi)) (i64.const 32))
      (i64.extend_i32_u (local.get $lo))))
    (local.set $j (i32.const 0))
    (loop $key
      (i64.store offset=192 (local.get $j) (i64.add (i64.load (local.get $j)) (local.get $seed)))
      (i64.store offset=200 (local.get $j) (i64.sub (i64.load offset=8 (local.get $j)) (local.get $seed)))
      (local.set $j (i32.add (local.get $j) (i32.const 16)))
      (br_if $key (i32.ne (local.get $j) (i32.const 128)))))

  ;; XXH3-64 of the $blocks windows of $window u32 words (5..32: 17..128 bytes) at $in, one every
  ;; $stride words, seeded by "setSeed"; the hashes go to $out as [hi, lo] pairs.
  (func $localHashes (export "localHashes")
    (param $in i32) (param $window i32) (param $stride i32) (param $blocks i32) (param $out i32)
    (local $len i32) (local $pairs i32) (local $p i32) (local $q i32) (local $k i32) (local $end i32)
    (local $acc i64) (local $a i64) (local $b i64)
    (local $alo i64) (local $ahi i64) (local $blo i64) (local $bhi i64)
    (local $lolo i64) (local $hilo i64) (local $cross i64)
    (local.set $len (i32.shl (local.get $window) (i32.const 2)))
    (local.set $pairs (i32.shr_u (i32.add (local.get $len) (i32.const 31)) (i32.const 5)))
    (local.set $end (i32.add (local.get $out) (i32.shl (local.get $blocks) (i32.const 3))))
    (block $done
      (loop $block
        (br_if $done (i32.eq (local.get $out) (local.get $end)))
        (local.set $acc (i64.mul (i64.extend_i32_u (local.get $len)) (i64.const 0x9e3779b185ebca87)))
        ;; 16-byte mixes from both ends inwards: (16i, keys 32i) and (len - 16 - 16i, keys 32i + 16).
        (local.set $p (local.get $in))
        (local.set $q (i32.sub (i32.add (local.get $in) (local.get $len)) (i32.const 16)))
        (local.set $k (i32.const 0))
        (local.set $pairs (i32.shr_u (i32.add (local.get $len) (i32.const 31)) (i32.const 5)))
        (loop $mix
          ;; The two mixes' products, with $mul128fold inlined: V8 does not inline wasm calls.
          (local.set $a (i64.xor (i64.load (local.get $p)) (i64.load offset=192 (local.get $k))))
          (local.set $b (i64.xor (i64.load offset=8 (local.get $p)) (i64.load offset=200 (local.get $k))))
          (local.set $alo (i64.and (local.get $a) (i64.const 0xffffffff)))
          (local.set $ahi (i64.shr_u (local.get $a) (i64.const 32)))
          (local.set $blo (i64.and (local.get $b) (i64.const 0xffffffff)))
          (local.set $bhi (i64.shr_u (local.get $b) (i64.const 32)))
          (local.set $lolo (i64.mul (local.get $alo) (local.get $blo)))
          (local.set $hilo (i64.mul (local.get $ahi) (local.get $blo)))
          (local.set $cross
            (i64.add
              (i64.add (i64.shr_u (local.get $lolo) (i64.const 32)) (i64.and (local.get $hilo) (i64.const 0xffffffff)))
              (i64.mul (local.get $alo) (local.get $bhi))))
          (local.set $acc (i64.add (local.get $acc) (i64.xor
            (i64.or (i64.shl (local.get $cross) (i64.const 32)) (i64.and (local.get $lolo) (i64.const 0xffffffff)))
            (i64.add
              (i64.add (i64.shr_u (local.get $hilo) (i64.const 32)) (i64.shr_u (local.get $cross) (i64.const 32)))
              (i64.mul (local.get $ahi) (local.get $bhi))))))
          (local.set $a (i64.xor (i64.load (local.get $q)) (i64.load offset=208 (local.get $k))))
          (local.set $b (i64.xor (i64.load offset=8 (local.get $q)) (i64.load offset=216 (local.get $k))))
          (local.set $alo (i64.and (local.get $a) (i64.const 0xffffffff)))
          (local.set $ahi (i64.shr_u (local.get $a) (i64.const 32)))
          (local.set $blo (i64.and (local.get $b) (i64.const 0xffffffff)))
          (local.set $bhi (i64.shr_u (local.get $b) (i64.const 32)))
          (local.set $lolo (i64.mul (local.get $alo) (local.get $blo)))
          (local.set $hilo (i64.mul (local.get $ahi) (local.get $blo)))
          (local.set $cross
            (i64.add
              (i64.add (i64.shr_u (local.get $lolo) (i64.const 32)) (i64.and (local.get $hilo) (i64.const 0xffffffff)))
              (i64.mul (local.get $alo) (local.get $bhi))))
          (local.set $acc (i64.add (local.get $acc) (i64.xor
            (i64.or (i64.shl (local.get $cross) (i64.const 32)) (i64.and (local.get $lolo) (i64.const 0xffffffff)))
            (i64.add
              (i64.add (i64.shr_u (local.get $hilo) (i64.const 32)) (i64.shr_u (local.get $cross) (i64.const 32)))
              (i64.mul (local.get $ahi) (local.get $bhi))))))
          (local.set $p (i32.add (local.get $p) (i32.const 16)))
          (local.set $q (i32.sub (local.get $q) (i32.const 16)))
          (local.set $k (i32.add (local.get $k) (i32.const 32)))
          (local.set $pairs (i32.sub (local.get $pairs) (i32.const 1)))
          (br_if $mix (local.get $pairs)))
        (local.set $acc (i64.xor (local.get $acc) (i64.shr_u (local.get $acc) (i64.const 37))))
        (local.set $acc (i64.mul (local.get $acc) (i64.const 0x165667919e3779f9)))
        (local.set $acc (i64.xor (local.get $acc) (i64.shr_u (local.get $acc) (i64.const 32))))
        (i32.store (local.get $out) (i32.wrap_i64 (i64.shr_u (local.get $acc) (i64.const 32))))
        (i32.store offset=4 (local.get $out) (i32.wrap_i64 (local.get $acc)))
        (local.set $in (i32.add (local.get $in) (i32.shl (local.get $stride) (i32.const 2))))
        (local.set $out (i32.add (local.get $out) (i32.const 8)))
        (br $block))))

  ;; Byte-reversal of a u64.
  (func $bswap64 (param $x i64) (result i64)
    (local.set $x (i64.or
      (i64.shl (i64.and (local.get $x) (i64.const 0x00ff00ff00ff00ff)) (i64.const 8))
      (i64.and (i64.shr_u (local.get $x) (i64.const 8)) (i64.const 0x00ff00ff00ff00ff))))
    (local.set $x (i64.or
      (i64.shl (i64.and (local.get $x) (i64.const 0x0000ffff0000ffff)) (i64.const 16))
      (i64.and (i64.shr_u (local.get $x) (i64.const 16)) (i64.const 0x0000ffff0000ffff))))
    (i64.rotl (local.get $x) (i64.const 32)))

  ;; The sequence-hash chain: for the $count [hi, lo] pairs at $in, seq = XXH3-64(LE64(previous) ||
  ;; LE64(local), seed), starting from the parent ($hasParent) or the first local hash itself;
  ;; the chain goes to $out as pairs ($out may be $in).
  (func $chain (export "chain")
    (param $in i32) (param $count i32) (param $hasParent i32) (param $parentHi i32) (param $parentLo i32)
    (param $seedHi i32) (param $seedLo i32) (param $out i32)
    (local $seed i64) (local $flip1 i64) (local $flip2 i64) (local $prev i64) (local $lo i64) (local $hi i64)
    (local $end i32)
    (local.set $seed (i64.or (i64.shl (i64.extend_i32_u (local.get $seedHi)) (i64.const 32))
      (i64.extend_i32_u (local.get $seedLo))))
    (local.set $flip1 (i64.add (i64.xor (i64.load (i32.const 24)) (i64.load (i32.const 32))) (local.get $seed)))
    (local.set $flip2 (i64.sub (i64.xor (i64.load (i32.const 40)) (i64.load (i32.const 48))) (local.get $seed)))
    (local.set $end (i32.add (local.get $in) (i32.shl (local.get $count) (i32.const 3))))
    (local.set $prev (i64.or (i64.shl (i64.extend_i32_u (local.get $parentHi)) (i64.const 32))
      (i64.extend_i32_u (local.get $parentLo))))
    (if (i32.and (i32.eqz (local.get $hasParent)) (i32.ne (local.get $in) (local.get $end)))
      (then
        (local.set $prev (call $loadPair (local.get $in)))
        (call $storePair (local.get $out) (local.get $prev))
        (local.set $in (i32.add (local.get $in) (i32.const 8)))
        (local.set $out (i32.add (local.get $out) (i32.const 8)))))
    (block $done
      (loop $link
        (br_if $done (i32.eq (local.get $in) (local.get $end)))
        (local.set $lo (i64.xor (local.get $prev) (local.get $flip1)))
        (local.set $hi (i64.xor (call $loadPair (local.get $in)) (local.get $flip2)))
        (local.set $prev (call $avalanche
          (i64.add
            (i64.add (i64.const 16) (call $bswap64 (local.get $lo)))
            (i64.add (local.get $hi) (call $mul128fold (local.get $lo) (local.get $hi))))))
        (call $storePair (local.get $out) (local.get $prev))
        (local.set $in (i32.add (local.get $in) (i32.const 8)))
        (local.set $out (i32.add (local.get $out) (i32.const 8)))
        (br $link))))
)
