//! `sluice_invariants::rules_document` on libFuzzer's inputs (see that function for what it checks).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_invariants::rules_document(data));
