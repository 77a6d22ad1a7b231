#!/usr/bin/env bash
# End-to-end checks of the fp8lab command line: outputs, exit codes, error messages and
# that a failing command leaves no partial output. Run by ctest with FP8LAB=path/to/fp8lab.
set -u
FP8LAB=${FP8LAB:-build/fp8lab}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { local what=$1; shift; if "$@"; then ok; else bad "$what"; fi; }

# make_npy PATH DESCR SHAPE BYTES(printf escapes): a .npy file as NumPy writes it.
make_npy() {
  local dict="{'descr': '$2', 'fortran_order': False, 'shape': ($3), }"
  local total=$((10 + ${#dict} + 1))
  local pad=$(((64 - total % 64) % 64))
  dict="$dict$(printf '%*s' "$pad" '')"
  local hl=$((${#dict} + 1))
  {
    printf '\x93NUMPY\x01\x00'
    printf "\\x$(printf %02x $((hl & 255)))\\x$(printf %02x $((hl >> 8)))"
    printf '%s\n' "$dict"
    printf "$4"
  } >"$1"
}
# 1.0, 250.0, -0.3, 1e-6, 247.9, NaN
FLOATS='\x00\x00\x80\x3f\x00\x00\x7a\x43\x9a\x99\x99\xbe\xbd\x37\x86\x35\x66\xe6\x77\x43\x00\x00\xc0\x7f'
make_npy "$T/x.npy" '<f4' '6,' "$FLOATS"
# A build without libtorch (FP8LAB_WITH_TORCH=OFF) has no training layer: its train,
# evaluate and quickstart only say so, and a sweep is listed, not run.
if "$FP8LAB" --help | grep -q 'built without libtorch'; then TORCH=0; else TORCH=1; fi

# --- formats: the paper's Table 1 ---------------------------------------------------------
out=$("$FP8LAB" formats --csv); rc=$?
check "formats exits 0" [ $rc -eq 0 ]
check "formats csv header" grep -q '^name,.*dynamic_range_db,snr_db$' <<<"$out"
check "Table 1 fp32" grep -q '^fp32,.*,1667.7,151.9$' <<<"$out"
check "Table 1 bf16" grep -q '^bf16,.*,1571.3,55.6$' <<<"$out"
check "Table 1 dlfloat16" grep -q '^dlfloat16,.*,385.3,67.6$' <<<"$out"
check "Table 1 1.4.3" grep -q '^1.4.3,.*,107.8,31.5$' <<<"$out"
check "Table 1 1.3.4" grep -q '^1.3.4,.*,66.0,37.5$' <<<"$out"
check "formats table prints" grep -q '^e4m3fn ' <<<"$("$FP8LAB" formats e4m3fn 1.5.2:24)"

# --- snr: Appendix A ------------------------------------------------------------------------
out=$("$FP8LAB" snr 1.0.7:-2 1.0.7:-1 1.0.7:0 --csv --samples 1000000)
check "snr csv header" grep -q '^name,.*measured_snr_db,model_snr_db' <<<"$out"
col() { awk -F, -v n="$1" -v c="$2" 'NR==1{for(i=1;i<=NF;i++) if($i==c) k=i} $1==n{print $k}' <<<"$out"; }
near() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN{d=a-b; if(d<0)d=-d; exit !(d<=t)}'; }
check "snr model 34.9" near "$(col 1.0.7:-2 model_snr_db)" 34.9 0.05
check "snr model 40.5" near "$(col 1.0.7:-1 model_snr_db)" 40.5 0.05
check "snr model 19.2" near "$(col 1.0.7:0 model_snr_db)" 19.2 0.05
check "snr measured 34.9" near "$(col 1.0.7:-2 measured_snr_db)" 34.9 0.2
check "snr measured 40.5" near "$(col 1.0.7:-1 measured_snr_db)" 40.5 0.2
check "snr measured 19.2" near "$(col 1.0.7:0 measured_snr_db)" 19.2 0.2

# --- snr: scaled formats, heavy tails, block sizes -------------------------------------------
out=$("$FP8LAB" snr mxfp4 nvfp4 1.2.1 --dist student-t:3 --samples 65536 --csv)
check "snr scaled: three rows" [ "$(grep -c '^\(mxfp4\|nvfp4\|1.2.1\),' <<<"$out")" -eq 3 ]
check "snr scaled: the quantizer spelled out" grep -q '^nvfp4,e2m1fn@1x16:ue4m3:nearest:tensor-scale,student-t:3,' <<<"$out"
# Block scales rescue FP4 on heavy tails: MXFP4 far above the fixed-bias 1.2.1.
check "snr mxfp4 above 1.2.1 on student-t:3" awk -v a="$(col mxfp4 measured_snr_db)" -v b="$(col 1.2.1 measured_snr_db)" 'BEGIN{exit !(a > b + 5)}'
out=$("$FP8LAB" snr mxfp4 --blocks 16,32,tensor --samples 65536 --csv)
check "snr --blocks: one row per size" [ "$(grep -c '^mxfp4,' <<<"$out")" -eq 3 ]
check "snr --blocks: 4.25 bits at 32" grep -q '^mxfp4,32,e2m1fn@1x32:e8m0:floor,normal,65536,4.250,' <<<"$out"
"$FP8LAB" snr e2m1fn e4m3fn --blocks 8,32,tensor --samples 8192 --plot "$T/blocks" >/dev/null
check "snr --plot writes svg and png" [ -s "$T/blocks.svg" -a -s "$T/blocks.png" ]

# --- values -----------------------------------------------------------------------------------
out=$("$FP8LAB" values e4m3fnuz --csv)
check "values lists 256 codes" [ "$(grep -c '^0x' <<<"$out")" -eq 256 ]
check "values NaN code" grep -q '^0x80,1,0000,000,nan,NaN$' <<<"$out"
check "values max" grep -q '^0x7f,0,1111,111,240,normal$' <<<"$out"
check "values subnormal" grep -q '^0x01,0,0000,001,0.0009765625,subnormal$' <<<"$out"
out=$("$FP8LAB" values e8m0 --csv)
check "e8m0 lists 256 codes" [ "$(grep -c '^0x' <<<"$out")" -eq 256 ]
check "e8m0 code 0 is 2^-127" grep -q '^0x00,-,00000000,-,5.87747175e-39,normal$' <<<"$out"
check "e8m0 code 127 is 1" grep -q '^0x7f,-,01111111,-,1,normal$' <<<"$out"
check "e8m0 NaN at 0xff" grep -q '^0xff,-,11111111,-,nan,NaN$' <<<"$out"
check "ue4m3 lists 128 codes" [ "$("$FP8LAB" values ue4m3 --csv | grep -c '^0x')" -eq 128 ]

# --- quantize: codes, fake quantization, decode -------------------------------------------
"$FP8LAB" quantize "$T/x.npy" "$T/c.npy" --format e4m3fnuz --codes -q
check "encode exits 0" [ $? -eq 0 ]
check "encoded codes" [ "$(tail -c 6 "$T/c.npy" | od -An -tx1 | tr -d ' \n')" = "407fb2007f80" ]
"$FP8LAB" quantize "$T/x.npy" "$T/q.npy" -f e4m3fnuz -q
"$FP8LAB" quantize "$T/c.npy" "$T/d.npy" -f e4m3fnuz --decode -q
check "decode(encode) == quantize" cmp -s <(tail -c 24 "$T/q.npy") <(tail -c 24 "$T/d.npy")
check "quantized 1.0 stays" [ "$(tail -c 24 "$T/q.npy" | head -c 4 | od -An -tx1 | tr -d ' \n')" = "0000803f" ]
err=$("$FP8LAB" quantize "$T/x.npy" "$T/s.npy" -f e4m3fnuz -o nan 2>&1 >/dev/null)
check "summary counts overflow" grep -q 'overflow 1, flushed to zero 1, NaN 2' <<<"$err"
"$FP8LAB" quantize "$T/x.npy" "$T/sr.npy" -f e5m2 -r stochastic --seed 3 -q
"$FP8LAB" quantize "$T/x.npy" "$T/sr2.npy" -f e5m2 -r stochastic --seed 3 -q --threads 1
check "stochastic reproducible" cmp -s "$T/sr.npy" "$T/sr2.npy"
"$FP8LAB" quantize "$T/x.npy" "$T/w.npy" -f fp16 --codes -q
check "16-bit codes are uint16" grep -aq "'<u2'" "$T/w.npy"

# --- quantize, scaled formats (docs/spec.md §6), values worked by hand ----------------------
# [[1, 3, -0.5, 0.1], [1, 250, -0.3, NaN]] in E2M1 blocks of 4 along rows, E8M0 floor scales:
# row 0: amax 3, scale 2^(1-2) = 0.5 (code 0x7e), x / 0.5 = 2, 6, -1, 0.2 -> 2, 6, -1, 0
# (codes 4, 7, 0xa, 0); row 1 holds a NaN: scale 0xff, every value NaN, codes 0.
make_npy "$T/m.npy" '<f4' '2, 4' '\x00\x00\x80\x3f\x00\x00\x40\x40\x00\x00\x00\xbf\xcd\xcc\xcc\x3d\x00\x00\x80\x3f\x00\x00\x7a\x43\x9a\x99\x99\xbe\x00\x00\xc0\x7f'
hex() { od -An -tx1 | tr -d ' \n'; }
"$FP8LAB" quantize "$T/m.npy" "$T/my.npy" -f e2m1fn@1x4 -q
check "mx block values" [ "$(tail -c 32 "$T/my.npy" | head -c 16 | hex)" = "0000803f00004040000000bf00000000" ]
check "mx NaN block" [ "$(tail -c 16 "$T/my.npy" | hex)" = "0000c07f0000c07f0000c07f0000c07f" ]
"$FP8LAB" quantize "$T/m.npy" "$T/mc.npy" -f e2m1fn@1x4 --codes -q
check "mx element codes" [ "$(tail -c 8 "$T/mc.npy" | hex)" = "04070a0000000000" ]
check "mx scale codes" [ "$(tail -c 2 "$T/mc.scales.npy" | hex)" = "7eff" ]
check "mx scales shape" grep -aq "'shape': (2, 1)" "$T/mc.scales.npy"
# One scale per column (--axis 0): column 1 = [3, 250] takes 2^(7-2) = 32, so 3 -> 0 and
# 250 -> 6 * 32 = 192 (saturated); column 3 holds the NaN.
err=$("$FP8LAB" quantize "$T/m.npy" "$T/ma.npy" -f e2m1fn@line --axis 0 2>&1 >/dev/null)
check "per column: 3 -> 0" [ "$(tail -c 32 "$T/ma.npy" | head -c 8 | tail -c 4 | hex)" = "00000000" ]
check "per column: 250 -> 192" [ "$(tail -c 12 "$T/ma.npy" | head -c 4 | hex)" = "00004043" ]
check "per column summary" grep -q '4 groups, 1 saturated, 1 NaN, 0 zero' <<<"$err"
"$FP8LAB" quantize "$T/m.npy" "$T/nv.npy" -f nvfp4 --codes -q
check "nvfp4 writes its tensor scale" [ -s "$T/nv.tensor_scale.npy" ]
# --decode reads the codes with their scales back: the bytes of the fake-quantized output.
"$FP8LAB" quantize "$T/mc.npy" "$T/md.npy" -f e2m1fn@1x4 --decode -q
check "mx decode == quantize" cmp -s <(tail -c 32 "$T/my.npy") <(tail -c 32 "$T/md.npy")
"$FP8LAB" quantize "$T/m.npy" "$T/nvy.npy" -f nvfp4 -q
"$FP8LAB" quantize "$T/nv.npy" "$T/nvd.npy" -f nvfp4 --decode -q
check "nvfp4 decode == quantize" cmp -s <(tail -c 32 "$T/nvy.npy") <(tail -c 32 "$T/nvd.npy")
# Where products apply the tensor scale changes no code: either order decodes the other's set.
"$FP8LAB" quantize "$T/nv.npy" "$T/nvdf.npy" -f nvfp4:tensor-scale-folded --decode -q; rc=$?
check "nvfp4 codes decode under tensor-scale-folded (got $rc)" [ $rc -eq 0 ]
check "either order decodes the same values" cmp -s "$T/nvd.npy" "$T/nvdf.npy"
"$FP8LAB" quantize "$T/m.npy" "$T/nvf.npy" -f nvfp4:tensor-scale-folded --codes -q
check "a folded set's manifest names the codes' format" grep -q '^format e2m1fn@1x16:ue4m3:nearest:tensor-scale$' "$T/nvf.codeset"
"$FP8LAB" quantize "$T/m.npy" "$T/dsf.npy" -f deepseek_1x128:scales-folded --codes -q
check "a scales-folded set's manifest names the codes' format" grep -q '^format e4m3fn@1x128:fp32:nearest$' "$T/dsf.codeset"
"$FP8LAB" quantize "$T/dsf.npy" "$T/dsd.npy" -f deepseek_1x128 --decode -q; rc=$?
check "deepseek codes written scales-folded decode under the default order (got $rc)" [ $rc -eq 0 ]
"$FP8LAB" quantize "$T/m.npy" "$T/mac.npy" -f e2m1fn@line --axis 0 --codes -q
"$FP8LAB" quantize "$T/mac.npy" "$T/mad.npy" -f e2m1fn@line --axis 0 --decode -q
check "per-column decode == quantize" cmp -s <(tail -c 32 "$T/ma.npy") <(tail -c 32 "$T/mad.npy")

# --- bad input: one line, exit 2, nothing written -------------------------------------------
expect_fail() {  # name, needle, command...
  local name=$1 needle=$2; shift 2
  local e
  e=$("$@" 2>&1 >/dev/null); local rc=$?
  check "$name: exit 2 (got $rc)" [ $rc -eq 2 ]
  check "$name: message has '$needle' (got: $e)" grep -qF -- "$needle" <<<"$e"
  check "$name: one line" [ "$(wc -l <<<"$e")" -eq 1 ]
}
expect_fail "bad format" "format '1.4'" "$FP8LAB" formats 1.4
expect_fail "bad format E" "E must be in 0..8" "$FP8LAB" values 1.9.3
expect_fail "unknown option" "--bogus" "$FP8LAB" formats --bogus
expect_fail "no subcommand" "subcommand" "$FP8LAB"
expect_fail "axis out of range" "--axis 2 does not exist" "$FP8LAB" quantize "$T/m.npy" "$T/bad.npy" -f mxfp4 --axis 2
expect_fail "axis of a fixed bias" "--axis applies to scaled formats only" "$FP8LAB" quantize "$T/m.npy" "$T/bad.npy" -f e5m2 --axis 0
expect_fail "scaled overflow mode" "scaled elements saturate" "$FP8LAB" quantize "$T/m.npy" "$T/bad.npy" -f mxfp8_e4m3 -o nan
expect_fail "bad granularity" "blocks are 1xK and tiles KxK" "$FP8LAB" quantize "$T/m.npy" "$T/bad.npy" -f e4m3fn@2x8
expect_fail "decode without scales" "mc2.scales.npy" bash -c "cp '$T/mc.npy' '$T/mc2.npy' && '$FP8LAB' quantize '$T/mc2.npy' '$T/bad.npy' -f e2m1fn@1x4 --decode"
expect_fail "decode with other blocks" "the code set was written for e2m1fn@1x4" "$FP8LAB" quantize "$T/mc.npy" "$T/bad.npy" -f e2m1fn@1x2 --decode
cp "$T/mc.npy" "$T/nm.npy"; cp "$T/mc.scales.npy" "$T/nm.scales.npy"  # a set without a manifest
expect_fail "decode with other blocks, no manifest" "the scales of" "$FP8LAB" quantize "$T/nm.npy" "$T/bad.npy" -f e2m1fn@1x2 --decode
cp "$T/nv.npy" "$T/nvx.npy"; cp "$T/nv.tensor_scale.npy" "$T/nvx.tensor_scale.npy"
make_npy "$T/nvx.scales.npy" '|u1' '2, 1' '\x38\xc8'
expect_fail "decode a code outside UE4M3" "value 200 at index 1 is not a ue4m3 code" "$FP8LAB" quantize "$T/nvx.npy" "$T/bad.npy" -f nvfp4 --decode
check "failed scaled quantize wrote nothing" [ ! -e "$T/bad.npy" ]
# A code set is one result (docs/reliability.md): no part of it may be an input, a failed
# write leaves the old set whole, and parts of different sets are refused together.
make_npy "$T/x0d.npy" '<f4' '' '\x00\x00\x80\x3f'
expect_fail "0-d array, scaled" "a 0-d array has no axis" "$FP8LAB" quantize "$T/x0d.npy" "$T/bad.npy" -f mxfp4 --codes
make_npy "$T/empty.npy" '<f4' '0, 32' ''
"$FP8LAB" quantize "$T/empty.npy" "$T/ec.npy" -f e4m3_tensor --codes -q; rc=$?
check "an empty array's per-tensor codes (got $rc)" [ $rc -eq 0 ]
check "no scale for no values" grep -aq "'shape': (0,)" "$T/ec.scales.npy"
"$FP8LAB" quantize "$T/ec.npy" "$T/ed.npy" -f e4m3_tensor --decode -q; rc=$?
check "and back (got $rc)" [ $rc -eq 0 ]
expect_fail "codes over their input's scales" "output must differ from input" "$FP8LAB" quantize "$T/mc.scales.npy" "$T/mc.npy" -f e2m1fn@1x4 --codes
expect_fail "decode over the input's scales" "output must differ from input" "$FP8LAB" quantize "$T/mc.npy" "$T/mc.scales.npy" -f e2m1fn@1x4 --decode
expect_fail "decode over the input's tensor scale" "output must differ from input" "$FP8LAB" quantize "$T/nv.npy" "$T/nv.tensor_scale.npy" -f nvfp4 --decode
check "the set survives" cmp -s <(tail -c 2 "$T/mc.scales.npy") <(printf '\x7e\xff')
check "a code set has a manifest" grep -q '^format e2m1fn@1x4:e8m0:floor$' "$T/mc.codeset"
"$FP8LAB" quantize "$T/x.npy" "$T/other.npy" -f e2m1fn@1x4 --axis 0 --codes -q 2>/dev/null
make_npy "$T/m2.npy" '<f4' '2, 4' '\x00\x00\x80\x40\x00\x00\x40\x40\x00\x00\x00\xbf\xcd\xcc\xcc\x3d\x00\x00\x80\x3f\x00\x00\x7a\x44\x9a\x99\x99\xbe\x00\x00\x80\x3f'
"$FP8LAB" quantize "$T/m2.npy" "$T/mc2set.npy" -f e2m1fn@1x4 --codes -q
cp "$T/mc.npy" "$T/mix.npy"; cp "$T/mc.codeset" "$T/mix.codeset"; cp "$T/mc2set.scales.npy" "$T/mix.scales.npy"
sed -i 's/ mc\./ mix./' "$T/mix.codeset"
expect_fail "scales of another set" "does not belong to the code set" "$FP8LAB" quantize "$T/mix.npy" "$T/bad.npy" -f e2m1fn@1x4 --decode
expect_fail "decoded under another format" "the code set was written for e2m1fn@1x4:e8m0:floor" "$FP8LAB" quantize "$T/mc.npy" "$T/bad.npy" -f e2m1fn@1x4:ceil --decode
make_npy "$T/ff.npy" '|u1' '2, 4' '\x04\x07\x0a\x00\xff\x00\x00\x00'
cp "$T/mc.scales.npy" "$T/ff.scales.npy"
expect_fail "a code outside E2M1" "value 255 at index 4 is not a 4-bit code" "$FP8LAB" quantize "$T/ff.npy" "$T/bad.npy" -f e2m1fn@1x4 --decode
expect_fail "fixed-bias code outside E2M1" "is not a 4-bit code" "$FP8LAB" quantize "$T/ff.npy" "$T/bad.npy" -f e2m1fn --decode
expect_fail "contradictory scaled options" "the rounding rule is given twice" "$FP8LAB" quantize "$T/m.npy" "$T/bad.npy" -f mxfp4:ceil:floor
err=$("$FP8LAB" quantize "$T/m.npy" "$T/un.npy" -f ue4m3@1x4 2>&1 >/dev/null)
# -0.5 in row 0, and row 1 (a NaN group): 5 NaN elements.
check "negative values to an unsigned format are counted as NaN ($err)" grep -q 'NaN 5;' <<<"$err"
# A file-size limit: the write fails with a message (not SIGXFSZ), the old set stays whole
# and no temporary is left.
make_npy "$T/big.npy" '<f4' '32, 32' ''
head -c 4096 /dev/zero >>"$T/big.npy"
"$FP8LAB" quantize "$T/m.npy" "$T/lim.npy" -f mxfp4 --codes -q
cp "$T/lim.npy" "$T/lim.keep"; cp "$T/lim.scales.npy" "$T/lim.scales.keep"; cp "$T/lim.codeset" "$T/lim.codeset.keep"
e=$( (ulimit -f 1; "$FP8LAB" quantize "$T/big.npy" "$T/lim.npy" -f mxfp4 --codes -q) 2>&1); rc=$?
check "file-size limit: exit 2 (got $rc: $e)" [ $rc -eq 2 ]
check "file-size limit: says why ($e)" grep -q 'File too large' <<<"$e"
check "file-size limit: codes kept" cmp -s "$T/lim.npy" "$T/lim.keep"
check "file-size limit: scales kept" cmp -s "$T/lim.scales.npy" "$T/lim.scales.keep"
check "file-size limit: manifest kept" cmp -s "$T/lim.codeset" "$T/lim.codeset.keep"
check "file-size limit: no temporaries" [ -z "$(ls "$T" | grep '\.tmp\.')" ]
# A code set is several files written together: a device cannot take part (nothing is made beside it).
expect_fail "code set onto a device" "/dev/null: is not a regular file" "$FP8LAB" quantize "$T/m.npy" /dev/null -f mxfp4 --codes
check "code set onto a device: nothing beside it" [ ! -e /dev/null.scales.npy ] && [ ! -e /dev/null.codeset ]
expect_fail "inf on fn" "overflow mode 'inf'" "$FP8LAB" quantize "$T/x.npy" "$T/o.npy" -f e4m3fn -o inf
ln -f "$T/x.npy" "$T/x-hardlink.npy"
expect_fail "quantize onto its input" "output must differ from input" "$FP8LAB" quantize "$T/x.npy" "$T/x-hardlink.npy" -f e4m3fn
expect_fail "quantize a folder" "is a folder" "$FP8LAB" quantize "$T" "$T/o.npy" -f e4m3fn
expect_fail "bad rounding" "unknown rounding 'up'" "$FP8LAB" quantize "$T/x.npy" "$T/o.npy" -f e4m3fn -r up
expect_fail "negative samples" "--samples must be in 1.." "$FP8LAB" snr 1.4.3 --samples -5
expect_fail "samples beyond float32" "outside [1e-30, 1e30]" "$FP8LAB" snr 1.4.3 --scale 1e300
expect_fail "outliers beyond float32" "times the outlier scale 1e+29" "$FP8LAB" snr 1.4.3 --dist normal-outliers:0.1:1e29 --scale 100
expect_fail "bad dist" "unknown distribution" "$FP8LAB" snr 1.4.3 --dist cauchy
expect_fail "student-t without dof" "expected student-t:DOF" "$FP8LAB" snr 1.4.3 --dist student-t
expect_fail "bad outlier fraction" "the outlier fraction must be a positive number" "$FP8LAB" snr 1.4.3 --dist normal-outliers:x:10
expect_fail "bad block size" "'0' is neither a block size" "$FP8LAB" snr mxfp4 --blocks 16,0
expect_fail "plot without blocks" "give --blocks too" "$FP8LAB" snr mxfp4 --plot "$T/p"
expect_fail "codes of fp32" "at most 16 bits" "$FP8LAB" values fp32
head -c 100 "$T/x.npy" >"$T/trunc.npy"
expect_fail "truncated npy" "truncated" "$FP8LAB" quantize "$T/trunc.npy" "$T/o.npy" -f e4m3fn
check "no output after failure" [ ! -e "$T/o.npy" ]
make_npy "$T/f64.npy" '<f8' '1,' '\x00\x00\x00\x00\x00\x00\xf0\x3f'
expect_fail "wrong dtype" "dtype '<f8'" "$FP8LAB" quantize "$T/f64.npy" "$T/o.npy" -f e4m3fn
expect_fail "decode wrong dtype" "needs dtype |u1" "$FP8LAB" quantize "$T/x.npy" "$T/o.npy" -f e4m3fn --decode
expect_fail "runs without store" "no results store" "$FP8LAB" runs --db "$T/none.db"
# A store that cannot be written is named as such, not as something that is not a store
# (as another user: root writes whatever the permissions say).
if [ "$(id -u)" -eq 0 ] && id nobody >/dev/null 2>&1 && su nobody -s /bin/bash -c "test -x '$FP8LAB'" 2>/dev/null; then
  RO=$(mktemp -d); chmod 755 "$RO"
  : >"$RO/s.db"
  "$FP8LAB" runs --db "$RO/s.db" >/dev/null 2>&1
  chmod 555 "$RO"; chmod 444 "$RO/s.db"
  e=$(su nobody -s /bin/bash -c "'$FP8LAB' runs --db '$RO/s.db'" 2>&1); rc=$?
  check "read-only store: exit 2 (got $rc)" [ $rc -eq 2 ]
  check "read-only store: says it cannot be written ($e)" grep -q 'cannot write the results store' <<<"$e"
  chmod -R u+w "$RO"; rm -rf "$RO"
fi
expect_fail "missing input" "cannot open" "$FP8LAB" quantize "$T/nope.npy" "$T/o.npy" -f e4m3fn
echo keep >"$T/keep.npy"
"$FP8LAB" quantize "$T/trunc.npy" "$T/keep.npy" -f e4m3fn 2>/dev/null
check "existing output kept on failure" [ "$(cat "$T/keep.npy")" = keep ]
check "no temporaries left" [ -z "$(ls "$T" | grep tmp)" ]

# --- sweep --dry-run and report: the study commands, with or without libtorch ------------
mkdir -p "$T/study"
# A small synthetic image task: the config of the study checks here and of train below.
cat >"$T/syn.toml" <<'TOML'
schema = 1
name = "syn"
[model]
name = "resnet8"
width = 4
[data]
name = "synthetic"
image_size = 8
synthetic_channels = 1
synthetic_classes = 2
synthetic_train = 128
synthetic_test = 64
[train]
epochs = 3
batch = 16
[quant]
recipe = "resnet32-mixed"
TOML
cat >"$T/study/sweep.toml" <<'TOML'
name = "study"
base = "../syn.toml"
seeds = 2
[[grid]]
lr = [0.1, 0.05]
"optimizer.lr" = "{lr}"
TOML
out=$("$FP8LAB" sweep "$T/study/sweep.toml" --dry-run --db "$T/study/s.db" --dir "$T/study/runs" 2>&1); rc=$?
check "sweep --dry-run exits 0 (got $rc)" [ $rc -eq 0 ]
check "sweep --dry-run lists its four runs" [ "$(grep -c '^start  lr=' <<<"$out")" -eq 4 ]
# A run's key is its config's identity: the same in a build with and without libtorch, and
# the same from one commit to the next (the store counts a run as done by it).
check "sweep --dry-run: the run keys of every build ($out)" grep -q "^start  lr=0.1 seed 1  ($T/study/runs/89b793b48e16be11.toml)" <<<"$out"
check "sweep --dry-run trains nothing" [ ! -e "$T/study/runs/89b793b48e16be11.log" ]
out=$("$FP8LAB" report "$T/study/sweep.toml" --db "$T/study/s.db" --out "$T/study/report" 2>&1); rc=$?
check "report of a sweep with no runs yet exits 0 (got $rc: $out)" [ $rc -eq 0 ]
check "report writes its table, every run missing" grep -q "^| 0.1 | .* | 0 (2 missing) |" "$T/study/report/table.md"
if [ $TORCH = 0 ]; then
  expect_fail "no libtorch: train says why" "built without libtorch (FP8LAB_WITH_TORCH=OFF)" "$FP8LAB" train "$T/syn.toml"
  expect_fail "no libtorch: quickstart says why" "built without libtorch" "$FP8LAB" quickstart
  expect_fail "no libtorch: a sweep is listed, not run" "lists a sweep's runs with --dry-run" \
    "$FP8LAB" sweep "$T/study/sweep.toml" --db "$T/study/s.db"
  check "no libtorch: sweep --dry-run says what it did not check" grep -q "not for the names of their tasks" <<<"$("$FP8LAB" sweep "$T/study/sweep.toml" --dry-run --db "$T/study/s.db" 2>&1)"
fi

# --- quickstart (when built with libtorch and the Debian dataset is present) --------------
if [ $TORCH = 1 ] && [ -d /usr/share/datasets/fashion-mnist ]; then
  out=$("$FP8LAB" quickstart --limit 256 --epochs 1 --batch 64 --width 4 --threads 1 --db "$T/r.db" 2>/dev/null); rc=$?
  check "quickstart exits 0 (got $rc)" [ $rc -eq 0 ]
  check "quickstart lists fp32" grep -q '^fp32 .*finished' <<<"$out"
  check "quickstart lists the 8-bit recipe" grep -q '^resnet32-mixed .*finished' <<<"$out"
  runs=$("$FP8LAB" runs --db "$T/r.db" --csv)
  check "store has both runs finished" [ "$(grep -c ',quickstart,image-classification,.*,finished,test_accuracy,' <<<"$runs")" -eq 2 ]
  check "runs --json carries the config" grep -q '"epochs": 1' <<<"$("$FP8LAB" runs --db "$T/r.db" --json)"
  check "runs --check says ok" grep -q 'r.db: ok' <<<"$("$FP8LAB" runs --db "$T/r.db" --check)"
  check "runs names the processor of its runs" grep -q '^Processors: .\+: 2 runs$' <<<"$("$FP8LAB" runs --db "$T/r.db")"
  check "runs filter" [ "$("$FP8LAB" runs --db "$T/r.db" --recipe fp32 --csv | grep -c finished)" -eq 1 ]
  expect_fail "quickstart without data" "no train-images" "$FP8LAB" quickstart --data "$T/none"
  expect_fail "quickstart bad recipe" "unknown key 'q'" "$FP8LAB" quickstart --recipe q=1.4.3
fi

# --- train: config files, --set, stop/resume, Ctrl-C, errors --------------------------------
if [ $TORCH = 1 ]; then
  S=(--set "train.checkpoint=$T/syn.ckpt" --set threads=1 --db "$T/t.db" --no-progress)
  out=$("$FP8LAB" train "$T/syn.toml" "${S[@]}" 2>"$T/err"); rc=$?
  check "train exits 0 (got $rc)" [ $rc -eq 0 ]
  check "train prints the run" grep -q '^1 *finished *resnet8' <<<"$out"
  check "train keeps the final weights" [ -s "$T/syn.ckpt" ]
  check "train names the store" grep -q "recorded as run 1 in $T/t.db" "$T/err"
  metric_of() { "$FP8LAB" runs --db "$T/t.db" --name "$1" --csv | awk -F, 'NR==2 {print $10}'; }
  full=$(metric_of syn)
  check "a final accuracy was recorded ($full)" [ -n "$full" ]
  out=$("$FP8LAB" train "$T/syn.toml" "${S[@]}" --set name=syn2 --set "train.checkpoint=$T/s2.ckpt" --stop-after 5 2>"$T/err"); rc=$?
  check "stop-after exits 0 (got $rc)" [ $rc -eq 0 ]
  check "stop-after says how to resume" grep -q -- "--resume" "$T/err"
  check "stopped run in the store" grep -q ',syn2,.*,stopped,' <<<"$("$FP8LAB" runs --db "$T/t.db" --csv)"
  expect_fail "train over a stopped run" "s2.ckpt: holds the checkpoint of an unfinished run" "$FP8LAB" train "$T/syn.toml" "${S[@]}" --set name=syn2 --set "train.checkpoint=$T/s2.ckpt"
  out=$("$FP8LAB" train "$T/syn.toml" "${S[@]}" --set name=syn2 --set "train.checkpoint=$T/s2.ckpt" --resume 2>/dev/null); rc=$?
  check "resume exits 0 (got $rc)" [ $rc -eq 0 ]
  check "resumed run ends with the uninterrupted accuracy ($full)" [ "$(metric_of syn2)" = "$full" ]
  check "resumed run is one finished run" [ "$("$FP8LAB" runs --db "$T/t.db" --name syn2 --csv | grep -c ',finished,')" -eq 1 ]
  # Ctrl-C: a checkpoint at the next step, status stopped, exit 130.
  "$FP8LAB" train "$T/syn.toml" "${S[@]}" --set name=syn3 --set "train.checkpoint=$T/s3.ckpt" --set train.epochs=400 >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do [ -s "$T/s3.ckpt" ] && break; sleep 0.1; done  # up to 60 s on a loaded machine
  kill -INT $pid
  wait $pid; rc=$?
  check "Ctrl-C exits 130 (got $rc)" [ $rc -eq 130 ]
  check "Ctrl-C leaves a stopped run" grep -q ',syn3,.*,stopped,' <<<"$("$FP8LAB" runs --db "$T/t.db" --csv)"
  check "no checkpoint temporaries" [ -z "$(ls "$T" | grep 'ckpt.tmp')" ]
  # --- data-parallel: --nproc ---------------------------------------------------------------
  # Two processes give the weights of one (the same shards, summed in the same order).
  P=(--set train.micro_batches=2 --db "$T/dp.db" --no-progress)
  fnv() { grep -o 'fnv1a64 [0-9a-f]*' "$1"; }
  "$FP8LAB" train "$T/syn.toml" "${P[@]}" --set threads=1 --set name=dp --set "train.checkpoint=$T/dp1.ckpt" >/dev/null 2>"$T/dp1"; rc=$?
  check "micro-batched train exits 0 (got $rc)" [ $rc -eq 0 ]
  "$FP8LAB" train "$T/syn.toml" "${P[@]}" --set name=dp --set "train.checkpoint=$T/dp2.ckpt" --nproc 2 >"$T/dp2out" 2>"$T/dp2"; rc=$?
  check "train --nproc 2 exits 0 (got $rc)" [ $rc -eq 0 ]
  check "--nproc 2 gives the weights of one process" [ -n "$(fnv "$T/dp1")" ] && [ "$(fnv "$T/dp1")" = "$(fnv "$T/dp2")" ]
  check "--nproc 2 names its processes" grep -q '^fp8lab: 2 processes on this machine (ranks 0..1: pids ' "$T/dp2"
  check "--nproc 2 reports its collectives" grep -q '^2 processes: .* per step in collectives' "$T/dp2"
  check "--nproc 2 prints one table" [ "$(grep -c '^run ' "$T/dp2out")" -eq 1 ]
  # Stopped on 2 processes, resumed on 1: said, and the same weights.
  "$FP8LAB" train "$T/syn.toml" "${P[@]}" --set name=dp --set "train.checkpoint=$T/dp3.ckpt" --nproc 2 --stop-after 5 >/dev/null 2>&1
  "$FP8LAB" train "$T/syn.toml" "${P[@]}" --set name=dp --set "train.checkpoint=$T/dp3.ckpt" --set threads=1 --resume >/dev/null 2>"$T/dp3"; rc=$?
  check "a run stopped on 2 processes resumes on 1 (got $rc)" [ $rc -eq 0 ]
  check "... saying so" grep -q 'written by 2 processes, the run goes on with 1: the same run' "$T/dp3"
  check "... with the same weights" [ "$(fnv "$T/dp1")" = "$(fnv "$T/dp3")" ]
  expect_fail "--nproc with one micro-batch" "add --set train.micro_batches=2" "$FP8LAB" train "$T/syn.toml" --nproc 2 --db "$T/dp.db"
  # NaN passes every comparison: refused by name, not handed to the ranks.
  expect_fail "--timeout nan" "--timeout: 'nan' is not a number in [1" "$FP8LAB" train "$T/syn.toml" "${P[@]}" --nproc 2 --timeout nan
  expect_fail "--stop-after -1" "--stop-after" "$FP8LAB" train "$T/syn.toml" "${P[@]}" --stop-after -1
  # Micro-batches of unequal sizes on two threads: the narrow ResNet's strided 1x1 shortcut
  # is where torch 2.13's oneDNN corrupted the heap (docs/spec.md §7.2).
  "$FP8LAB" train "$T/syn.toml" "${P[@]}" --set threads=2 --set train.micro_batches=3 --set name=dpu --set "train.checkpoint=$T/dpu.ckpt" >/dev/null 2>"$T/dpu"; rc=$?
  check "unequal micro-batches on two threads exit 0 (got $rc: $(tail -1 "$T/dpu"))" [ $rc -eq 0 ]
  expect_fail "half a launcher's variables" "RANK, WORLD_SIZE set but MASTER_ADDR, MASTER_PORT not" env RANK=0 WORLD_SIZE=2 "$FP8LAB" train "$T/syn.toml" --db "$T/dp.db"
  # A rank killed mid-run ends the other at once; the run is marked failed, and resumes to
  # the weights of the uninterrupted run.
  K=(--set name=dpk --set train.epochs=150 --set "train.checkpoint=$T/dpk.ckpt")
  "$FP8LAB" train "$T/syn.toml" "${P[@]}" "${K[@]}" --set threads=1 --set "train.checkpoint=$T/dpk1.ckpt" >/dev/null 2>"$T/dpk1"
  # start_ranks NAME ARGS...: `train --nproc 2` in the background (stderr to $T/NAME), back once
  # its first checkpoint $T/NAME.ckpt exists; sets pid (the launcher's) and r1 (rank 1's).
  # HOLD_SIGINT PROGRAM ARGS...: runs PROGRAM with SIGINT held, as a sweep starts its runs
  # (an array, not a function: `cmd &` must start the program itself, so that $! is its pid).
  HOLD_SIGINT=(perl -MPOSIX -e 'sigprocmask(SIG_BLOCK, POSIX::SigSet->new(SIGINT)) or die "sigprocmask"; exec @ARGV or die "exec"' --)
  # With HOLD set, start_ranks starts the launcher with SIGINT held.
  start_ranks() {
    local name=$1 pre=(); shift
    [ -n "${HOLD:-}" ] && pre=("${HOLD_SIGINT[@]}")
    "${pre[@]}" "$FP8LAB" train "$T/syn.toml" "${P[@]}" --set name="$name" --set "train.checkpoint=$T/$name.ckpt" --nproc 2 "$@" >/dev/null 2>"$T/$name" &
    pid=$!
    for _ in $(seq 1 600); do [ -s "$T/$name.ckpt" ] && break; sleep 0.1; done
    r1=$(sed -n 's/^fp8lab: 2 processes on this machine (ranks 0..1: pids [0-9]* \([0-9]*\)).*/\1/p' "$T/$name")
  }
  start_ranks dpk "${K[@]}" --timeout 30
  t0=$(date +%s)
  kill -KILL "$r1"
  wait $pid; rc=$?
  check "a killed rank fails the run (got $rc)" [ $rc -ne 0 ]
  check "... well within the timeout" [ $(($(date +%s) - t0)) -lt 20 ]
  check "... naming the rank and the signal" grep -q 'rank 1 of 2 was killed by signal 9' "$T/dpk"
  check "... and rank 0's failed exchange (launcher: $(grep '^fp8lab: rank' "$T/dpk" | tr '\n' ' '))" grep -q 'data-parallel rank 0 of 2: .* failed' "$T/dpk"
  check "... marked failed in the store" [ "$("$FP8LAB" runs --db "$T/dp.db" --name dpk --csv | grep -c ',failed,')" -eq 1 ]
  "$FP8LAB" train "$T/syn.toml" "${P[@]}" "${K[@]}" --nproc 2 --resume >/dev/null 2>"$T/dpk2"; rc=$?
  check "the killed run resumes (got $rc)" [ $rc -eq 0 ]
  check "... to the uninterrupted run's weights" [ -n "$(fnv "$T/dpk1")" ] && [ "$(fnv "$T/dpk1")" = "$(fnv "$T/dpk2")" ]
  check "... recorded once: the resumed run and the uninterrupted one, both finished" [ "$("$FP8LAB" runs --db "$T/dp.db" --name dpk --csv | grep -c ',finished,')" -eq 2 ] && [ "$("$FP8LAB" runs --db "$T/dp.db" --name dpk --csv | wc -l)" -eq 3 ]
  # A rank that hangs (stopped): the other gives up after --timeout, and the launcher ends it.
  start_ranks dph --set train.epochs=400 --timeout 3
  t0=$(date +%s)
  kill -STOP "$r1"
  wait $pid; rc=$?
  check "a hung rank fails the run (got $rc)" [ $rc -ne 0 ]
  check "... after the timeout" [ $(($(date +%s) - t0)) -lt 20 ]
  check "... saying so" grep -q 'did not answer within 3.0 s' "$T/dph"
  check "... and the hung rank is gone" [ ! -d "/proc/$r1" ] || grep -q '^State:.*Z' "/proc/$r1/status"
  # A launcher started with SIGINT held (as a sweep starts its runs) still passes a SIGINT
  # on: both ranks stop at their next step with a checkpoint.
  HOLD=1 start_ranks dpi --set train.epochs=400
  check "HOLD_SIGINT holds SIGINT" "${HOLD_SIGINT[@]}" grep -q '^SigBlk:.*[2367abef]$' /proc/self/status
  check "the held launcher's ranks started" [ -n "$r1" ]
  kill -INT "$pid"
  for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  wait $pid; rc=$?
  check "a launcher started with SIGINT held passes it on (got $rc, want 130)" [ $rc -eq 130 ]
  check "... and the run stops with a checkpoint" [ "$("$FP8LAB" runs --db "$T/dp.db" --name dpi --csv | grep -c ',stopped,')" -eq 1 ]
  out=$("$FP8LAB" train "$T/syn.toml" --set train.epochs=9 --print-config); rc=$?
  check "print-config" grep -q '^epochs = 9$' <<<"$out"
  printf 'schema = 1\n[train]\nepochs = 2\nbach = 3\n' >"$T/bad.toml"
  expect_fail "train unknown key" "bad.toml:4: unknown key 'train.bach'" "$FP8LAB" train "$T/bad.toml"
  : >"$T/empty.toml"
  expect_fail "train empty config" "empty.toml: not an fp8lab config" "$FP8LAB" train "$T/empty.toml"
  expect_fail "train folder as config" "is a folder" "$FP8LAB" train "$T"
  expect_fail "train device as config" "/dev/null: is not a regular file" "$FP8LAB" train /dev/null
  expect_fail "train infinite weight decay" "optimizer.weight_decay must be a finite number" "$FP8LAB" train "$T/syn.toml" --set optimizer.weight_decay=inf
  expect_fail "train huge loss scale" "'log2 scale' must be an integer in -126..127" "$FP8LAB" train "$T/syn.toml" --set quant.loss_scale=static:1e300
  expect_fail "train bad --set" "--set optimizer.lr=fast: 'optimizer.lr' must be a number" "$FP8LAB" train "$T/syn.toml" --set optimizer.lr=fast
  expect_fail "train missing config" "none.toml: cannot open" "$FP8LAB" train "$T/none.toml"
  expect_fail "resume without checkpoint" "no checkpoint to resume from" "$FP8LAB" train "$T/syn.toml" --set "train.checkpoint=$T/none.ckpt" --resume --db "$T/t.db"
  expect_fail "resume with another config" "different config (/train/batch)" "$FP8LAB" train "$T/syn.toml" --set name=syn3 --set "train.checkpoint=$T/s3.ckpt" --set train.epochs=400 --set train.batch=8 --resume --db "$T/t.db" --set threads=1

  # --- sweep and report -------------------------------------------------------------------
  cat >"$T/sw.toml" <<'TOML'
name = "clisweep"
base = "syn.toml"
seeds = 2
baseline = "recipe=fp32"
[set]
"threads" = 1
[[grid]]
recipe = ["fp32", "resnet32-mixed"]
"quant.recipe" = "{recipe}"
[[plot]]
type = "metric"
x = "recipe"
[[plot]]
type = "fixed-point-snr"
file = "snr"
TOML
  W=(--db "$T/sw.db" --dir "$T/swruns" --no-progress)
  mkdir -p "$T/tmp"
  # Copies left by killed sweeps: one whose owner has ended goes, a live owner's and an
  # unowned one stay, and the live owner is named as another sweep sharing the cores.
  dead=$(sh -c 'echo $$')
  mkdir -p "$T/tmp/fp8lab-sweep-dead00" "$T/tmp/fp8lab-sweep-live00" "$T/tmp/fp8lab-sweep-none00"
  echo "$dead" >"$T/tmp/fp8lab-sweep-dead00/owner"
  echo "$$" >"$T/tmp/fp8lab-sweep-live00/owner"
  TMPDIR="$T/tmp" "$FP8LAB" sweep "$T/sw.toml" "${W[@]}" --jobs 2 2>"$T/err"; rc=$?
  check "sweep exits 0 (got $rc)" [ $rc -eq 0 ]
  check "sweep starts its runs from a copy of the program" grep -q "runs start from a copy of this program in $T/tmp/fp8lab-sweep-" "$T/err"
  check "sweep warns of another sweep sharing the cores" grep -q "warning: another sweep (process $$) is running on this machine" "$T/err"
  check "sweep removes a copy whose sweep has ended" grep -q "removed $T/tmp/fp8lab-sweep-dead00, a copy of the program left by sweep process $dead" "$T/err"
  check "sweep removes its copy of the program and only stale ones" [ "$(ls -A "$T/tmp" | tr '\n' ' ')" = "fp8lab-sweep-live00 fp8lab-sweep-none00 " ]
  rm -r "$T/tmp/fp8lab-sweep-live00" "$T/tmp/fp8lab-sweep-none00"
  check "sweep runs all four" grep -q '4 runs: 0 already done, 4 started, 0 resumed; 4 finished' "$T/err"
  check "sweep prints each run" grep -q '^\[4/4\] .* finished test_accuracy' "$T/err"
  check "sweep keeps logs" [ "$(ls "$T/swruns" | grep -c '\.log$')" -eq 4 ]
  "$FP8LAB" sweep "$T/sw.toml" "${W[@]}" 2>"$T/err"; rc=$?
  check "sweep again exits 0 (got $rc)" [ $rc -eq 0 ]
  check "sweep again skips all" grep -q '4 runs: 4 already done, 0 started' "$T/err"
  "$FP8LAB" sweep "$T/sw.toml" "${W[@]}" --same-machine 2>"$T/err"; rc=$?
  check "sweep --same-machine accepts runs all made here (got $rc)" [ $rc -eq 0 ] && grep -q '4 runs: 4 already done' "$T/err"
  # Shards: each holds half the runs, and together they hold each run once.
  for i in 0 1; do
    "$FP8LAB" sweep "$T/sw.toml" --db "$T/shard.db" --dir "$T/shardruns" --shard $i/2 --dry-run 2>"$T/shard$i"
  done
  check "shard 0/2 holds 2 of 4" grep -q 'shard 0/2 holds 2 of the 4 runs' "$T/shard0"
  check "shard 1/2 holds 2 of 4" grep -q 'shard 1/2 holds 2 of the 4 runs' "$T/shard1"
  check "shards together hold each run once" [ "$(cat "$T/shard0" "$T/shard1" | grep '^start' | sort -u | wc -l)" -eq 4 ]
  expect_fail "sweep --shard out of range" "--shard '2/2': I must be in 0..1" "$FP8LAB" sweep "$T/sw.toml" --db "$T/shard.db" --shard 2/2
  out=$("$FP8LAB" report "$T/sw.toml" --db "$T/sw.db" --out "$T/rep" 2>"$T/err"); rc=$?
  check "report exits 0 (got $rc)" [ $rc -eq 0 ]
  check "report table" grep -q '^| fp32 | fp32 | fp32 | fp32 | fp32 | .* | 2 | baseline |$' <<<"$out"
  check "report files" [ -s "$T/rep/table.md" ] && [ -s "$T/rep/table.csv" ] && [ -s "$T/rep/snr.svg" ] && [ -s "$T/rep/snr.png" ]
  check "report: a metric plot of a non-numeric x is skipped" grep -q "plot 'plot1-metric' (metric) has no data" "$T/err"
  check "report names the processor its runs were made on" grep -q '^Runs made on .\+\.$' "$T/rep/table.md"
  one_processor() { ! grep -q "not all made on one recorded processor" "$T/err"; }
  check "... and does not warn of several" one_processor
  # Slurm: the emitted job array names every shard once, each task writes its own store, and
  # the report over the tasks' stores is the report over the one store of the sweep above.
  "$FP8LAB" sweep "$T/sw.toml" --emit slurm --shards 3 --dir "$T/slurm" >"$T/job.sh" 2>"$T/err"; rc=$?
  check "--emit slurm exits 0 (got $rc)" [ $rc -eq 0 ]
  check "--emit slurm: an array of 3 tasks" grep -q '^#SBATCH --array=0-2$' "$T/job.sh"
  check "--emit slurm: a shard per task" grep -q -- '--shard "${SLURM_ARRAY_TASK_ID}/3"' "$T/job.sh"
  check "--emit slurm: a store per task" grep -q -- "--db '$T/slurm'/shard-\"\${SLURM_ARRAY_TASK_ID}\".db" "$T/job.sh"
  for i in 0 1 2; do SLURM_ARRAY_TASK_ID=$i bash "$T/job.sh" --dry-run 2>"$T/task$i"; done
  check "the tasks hold each run once" [ "$(cat "$T"/task? | grep '^start' | sort -u | wc -l)" -eq 4 ] && [ "$(cat "$T"/task? | grep -c '^start')" -eq 4 ]
  outside_slurm() { ! bash "$T/job.sh" --dry-run 2>/dev/null; }
  check "the script refuses to run outside Slurm" outside_slurm
  for i in 0 1 2; do SLURM_ARRAY_TASK_ID=$i bash "$T/job.sh" 2>/dev/null; done
  check "each task wrote its store" [ -s "$T/slurm/shard-0.db" ] && [ -s "$T/slurm/shard-1.db" ] && [ -s "$T/slurm/shard-2.db" ]
  D=(--db "$T/slurm/shard-0.db" --db "$T/slurm/shard-1.db" --db "$T/slurm/shard-2.db")
  one=$("$FP8LAB" report "$T/sw.toml" --db "$T/sw.db" --out "$T/rep1" 2>/dev/null)
  many=$("$FP8LAB" report "$T/sw.toml" "${D[@]}" --out "$T/rep3" 2>/dev/null); rc=$?
  check "report over the tasks' stores exits 0 (got $rc)" [ $rc -eq 0 ]
  check "... and equals the report over one store" [ -n "$many" ] && [ "$one" = "$many" ]
  check "runs over several stores names each run's store" grep -q "shard-2.db run 1 " <<<"$("$FP8LAB" runs "${D[@]}")"
  check "runs over several stores lists them all" [ "$("$FP8LAB" runs "${D[@]}" --csv | grep -c ',finished,')" -eq 4 ]
  check "runs --check over several stores" [ "$("$FP8LAB" runs "${D[@]}" --check | grep -c ': ok$')" -eq 3 ]
  # What goes into the script is the user's data, never lines of the user's choosing.
  nl=$'\n'
  expect_fail "a newline in --dir" "a control character (code 10) cannot go into a job script" "$FP8LAB" sweep "$T/sw.toml" --emit slurm --dir "$T/a${nl}touch $T/pwned${nl}"
  expect_fail "a newline in --time" "not a Slurm time limit" "$FP8LAB" sweep "$T/sw.toml" --emit slurm --time "1:00${nl}touch $T/pwned"
  expect_fail "a bogus --time" "--time 'bogus': not a Slurm time limit" "$FP8LAB" sweep "$T/sw.toml" --emit slurm --time bogus
  expect_fail "a space in --dir" "cannot hold ' '" "$FP8LAB" sweep "$T/sw.toml" --emit slurm --dir "$T/a b"
  expect_fail "a % in --dir" "cannot hold '%'" "$FP8LAB" sweep "$T/sw.toml" --emit slurm --dir "$T/a%j"
  check "nothing of it ran" [ ! -e "$T/pwned" ]
  emits() { "$FP8LAB" sweep "$T/sw.toml" --emit slurm --dir "$T/slurm-t" --time "$1" >/dev/null 2>&1; }
  for t in 30 30:00 4:00:00 2-12 2-12:30 2-12:30:15 UNLIMITED; do check "--time $t accepted" emits "$t"; done
  expect_fail "--shard with --emit" "leave out --shard" "$FP8LAB" sweep "$T/sw.toml" --emit slurm --shard 0/2
  expect_fail "--shards without --emit" "use them with --emit slurm" "$FP8LAB" sweep "$T/sw.toml" --shards 2 --db "$T/sw.db"
  expect_fail "report without a sweep or a name" "give a sweep file or --name NAME" "$FP8LAB" report --db "$T/sw.db"
  expect_fail "report --name of no run" "no run named 'nobody'" "$FP8LAB" report --name nobody --db "$T/sw.db"
  # A path the system refuses (a file where a folder must be, a name too long) is the
  # user's error: exit 2 with the operation and the path, never an internal error.
  touch "$T/afile"
  expect_fail "report --out on a file" "$T/afile: exists and is not a folder" "$FP8LAB" report "$T/sw.toml" --db "$T/sw.db" --out "$T/afile"
  e=$("$FP8LAB" sweep "$T/sw.toml" --db "$T/sw.db" --dir "$T/afile" --no-progress 2>&1 >/dev/null); rc=$?
  check "sweep --dir on a file: exit 2 (got $rc)" [ $rc -eq 2 ]
  check "sweep --dir on a file: the last line says why (got: $e)" grep -qF "error: $T/afile: exists and is not a folder" <<<"$(tail -1 <<<"$e")"
  expect_fail "runs --db name too long" "File name too long" "$FP8LAB" runs --db "$(printf 'a%.0s' $(seq 300))"
  "$FP8LAB" sweep "$T/sw.toml" --db "$T/sw.db" --dir "$T/dryrun" --dry-run >/dev/null 2>&1
  check "sweep --dry-run creates no folder" [ ! -e "$T/dryrun" ]
  # Ctrl-C: each run stops with a checkpoint; the sweep again resumes them.
  cat >"$T/stop.toml" <<'TOML'
name = "clistop"
base = "syn.toml"
[set]
"threads" = 1
"train.epochs" = 300
[[grid]]
recipe = ["fp32", "resnet32-mixed"]
"quant.recipe" = "{recipe}"
TOML
  W=(--db "$T/sw.db" --dir "$T/stopruns" --no-progress)
  TMPDIR="$T/tmp" "$FP8LAB" sweep "$T/stop.toml" "${W[@]}" --jobs 2 >/dev/null 2>"$T/err" &
  pid=$!
  for _ in $(seq 1 600); do [ "$(ls "$T/stopruns" 2>/dev/null | grep -c '\.ckpt$')" -ge 2 ] && break; sleep 0.1; done
  # The running runs execute the sweep's private copy, not the program in the build folder.
  exes=$(for c in $(pgrep -P $pid); do readlink "/proc/$c/exe"; done | sort -u)
  check "sweep runs execute the copy (got: $exes)" grep -qx "$T/tmp/fp8lab-sweep-[A-Za-z0-9]*/fp8lab" <<<"$exes"
  kill -INT $pid
  wait $pid; rc=$?
  check "sweep Ctrl-C exits 130 (got $rc)" [ $rc -eq 130 ]
  check "sweep Ctrl-C removes the copy of the program" [ -z "$(ls -A "$T/tmp")" ]
  check "sweep Ctrl-C says how to go on" grep -q 'run the same command again' "$T/err"
  check "sweep Ctrl-C leaves stopped runs" [ "$("$FP8LAB" runs --db "$T/sw.db" --csv --name clistop | grep -c ',stopped,')" -eq 2 ]
  "$FP8LAB" sweep "$T/stop.toml" "${W[@]}" --jobs 2 --dry-run 2>"$T/err"; rc=$?
  check "sweep dry run lists resumes" [ "$(grep -c '^resume' "$T/err")" -eq 2 ]
  printf 'name = "x"\n[[grid]]\nr = [1]\n"optimizer.lr" = "{q}"\n' >"$T/badsw.toml"
  expect_fail "sweep unknown template variable" "uses {q}, which is not a variable" "$FP8LAB" sweep "$T/badsw.toml" --db "$T/sw.db"
  printf 'name = "x"\nseedz = 1\n' >"$T/badsw.toml"
  expect_fail "sweep unknown key" "badsw.toml:2: unknown key 'seedz'" "$FP8LAB" sweep "$T/badsw.toml" --db "$T/sw.db"
fi

# --- evaluate: a checkpoint's final evaluation, cached against reference decoding -----------
if [ $TORCH = 1 ] && command -v spm_train >/dev/null; then
  mkdir -p "$T/words"
  # A word-for-word "translation" (English -> Spanish words, same order), 3..5 words a line.
  awk -v dir="$T/words" 'BEGIN { split("god light earth water day night man king", en, " ");
               split("dios luz tierra agua dia noche hombre rey", es, " "); x = 12345;
               n["train"] = 1500; n["dev"] = 30; n["test"] = 30;
               for (s in n) for (i = 0; i < n[s]; i++) {
                 x = (x * 1103515245 + 12345) % 2147483648; len = 3 + x % 3; a = ""; b = "";
                 for (k = 0; k < len; k++) { x = (x * 1103515245 + 12345) % 2147483648; w = 1 + int(x / 65536) % 8;
                   a = a (k ? " " : "") en[w]; b = b (k ? " " : "") es[w] }
                 print a > (dir "/" s ".en"); print b > (dir "/" s ".es") } }'
  cat >"$T/words.toml" <<TOML
schema = 1
name = "words"
task = "translation"
threads = 2
[model]
name = "transformer-tiny"
dropout = 0.0
[data]
name = "parallel"
dir = "$T/words"
vocab_size = 40
max_tokens = 16
[optimizer]
name = "adam"
lr = 0.002
beta2 = 0.98
weight_decay = 0.0
[schedule]
name = "warmup-invsqrt"
warmup_steps = 20
[train]
steps = 160
batch = 32
eval_interval = 160
beam = 3
checkpoint = "$T/words.ckpt"
[quant]
recipe = "transformer-mixed"
TOML
  out=$("$FP8LAB" train "$T/words.toml" --db "$T/words.db" --no-progress 2>"$T/err"); rc=$?
  check "translation run exits 0 (got $rc)" [ $rc -eq 0 ]
  check "train reports the final evaluation's time" grep -q 'evaluation: .* s the final one' "$T/err"
  bleu=$("$FP8LAB" runs --db "$T/words.db" --csv | awk -F, '$3 == "words" { printf "%.4f", $10 }')
  out=$("$FP8LAB" evaluate "$T/words.toml" --out "$T/cached.txt" 2>"$T/err"); rc=$?
  check "evaluate exits 0 (got $rc)" [ $rc -eq 0 ]
  check "evaluate gives the run's test BLEU ($bleu)" [ "$(awk '$1 == "test_bleu" { print $2 }' <<<"$out")" = "$bleu" ]
  check "evaluate writes one hypothesis per test sentence" [ "$(wc -l <"$T/cached.txt")" -eq 30 ]
  "$FP8LAB" evaluate "$T/words.toml" --decoder reference --out "$T/reference.txt" >/dev/null 2>&1
  check "the reference decoder's hypotheses are the cached decoder's" cmp -s "$T/cached.txt" "$T/reference.txt"
  "$FP8LAB" evaluate "$T/words.toml" --set train.beam=1 --out "$T/greedy.txt" >/dev/null 2>&1; rc=$?
  check "evaluate may change the beam (got $rc)" [ $rc -eq 0 ]
  "$FP8LAB" evaluate "$T/words.toml" --set train.beam=1 --decoder reference --out "$T/greedy-ref.txt" >/dev/null 2>&1
  check "greedy: reference and cached agree" cmp -s "$T/greedy.txt" "$T/greedy-ref.txt"
  expect_fail "evaluate with another training config" "different config (/optimizer/lr)" \
    "$FP8LAB" evaluate "$T/words.toml" --set optimizer.lr=0.1
  expect_fail "evaluate without a checkpoint" "no checkpoint to evaluate" \
    "$FP8LAB" evaluate "$T/words.toml" --checkpoint "$T/none.ckpt"
  # --out may be no file the evaluation reads: checked before it runs, the file left as it was.
  cp "$T/words.toml" "$T/words.keep"; cp "$T/words.ckpt" "$T/ckpt.keep"; cp "$T/words/test.en" "$T/test.keep"
  ln -sf "$T/words.ckpt" "$T/ckpt.link"
  expect_fail "evaluate --out over its config" "is the config" "$FP8LAB" evaluate "$T/words.toml" --out "$T/words.toml"
  expect_fail "evaluate --out over its checkpoint (a link)" "is the checkpoint" \
    "$FP8LAB" evaluate "$T/words.toml" --out "$T/ckpt.link"
  expect_fail "evaluate --out into the data folder" "is in the data folder" \
    "$FP8LAB" evaluate "$T/words.toml" --out "$T/words/../words/test.en"
  check "evaluate --out refusals keep the config" cmp -s "$T/words.toml" "$T/words.keep"
  check "evaluate --out refusals keep the checkpoint" cmp -s "$T/words.ckpt" "$T/ckpt.keep"
  check "evaluate --out refusals keep the test set" cmp -s "$T/words/test.en" "$T/test.keep"
fi

# --- text corpora that are no regular files: refused by name, never waited on ---------------
if [ $TORCH = 1 ]; then
  for kind in fifo zero folder empty; do
    mkdir -p "$T/text-$kind"
    case $kind in
      fifo) mkfifo "$T/text-$kind/train.txt" ;;
      zero) ln -s /dev/zero "$T/text-$kind/train.txt" ;;
      folder) mkdir "$T/text-$kind/train.txt" ;;
      empty) : >"$T/text-$kind/train.txt" ;;
    esac
    echo "a b c" >"$T/text-$kind/dev.txt"
    case $kind in fifo|zero) want="is not a regular file" ;; folder) want="is a folder" ;; empty) want="no text" ;; esac
    for task in language-model:gpt-tiny bert:bert-tiny; do
      [ $kind = empty ] && [ ${task%%:*} = bert ] && want="at least two sentences"
      expect_fail "text corpus $kind, ${task%%:*}" "$want" timeout 60 "$FP8LAB" train --set task=${task%%:*} \
        --set model.name=${task#*:} --set data.name=text --set "data.dir=$T/text-$kind" --set train.steps=1 \
        --db "$T/text.db" --no-progress
    done
  done
fi

echo "cli: $pass passed, $fail failed"
[ $fail -eq 0 ]
