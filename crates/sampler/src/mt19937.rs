//! The 32-bit Mersenne Twister (`std::mt19937` of C++) and the `[0, 1)` double that
//! libstdc++'s `std::uniform_real_distribution<double>` draws from it.

const N: usize = 624;
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER: u32 = 0x8000_0000;
const LOWER: u32 = 0x7fff_ffff;

/// MT19937 with the standard seeding (`std::mt19937(seed)`).
#[derive(Clone)]
pub struct Mt19937 {
    state: [u32; N],
    index: usize,
}

impl std::fmt::Debug for Mt19937 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mt19937")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl Mt19937 {
    /// The generator `std::mt19937(seed)` would be.
    pub fn new(seed: u32) -> Self {
        let mut state = [0u32; N];
        state[0] = seed;
        for i in 1..N {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { state, index: N }
    }

    /// Re-seeds in place (`rng.seed(seed)`).
    pub fn reseed(&mut self, seed: u32) {
        *self = Mt19937::new(seed);
    }

    fn twist(&mut self) {
        for i in 0..N {
            let y = (self.state[i] & UPPER) | (self.state[(i + 1) % N] & LOWER);
            let mut next = self.state[(i + M) % N] ^ (y >> 1);
            if y & 1 != 0 {
                next ^= MATRIX_A;
            }
            self.state[i] = next;
        }
        self.index = 0;
    }

    /// The next 32-bit output.
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// A double in `[0, 1)` exactly as libstdc++'s `std::generate_canonical<double, 53>`
    /// computes it (and so `std::uniform_real_distribution<double>(0, 1)`): two outputs,
    /// the first as the low and the second as the high 32 bits of a sum rounded to double,
    /// divided by 2^64; a result that rounds up to 1 becomes the largest double below 1.
    pub fn next_f64(&mut self) -> f64 {
        let low = f64::from(self.next_u32());
        let high = f64::from(self.next_u32());
        let sum = low + high * 4_294_967_296.0;
        let r = sum / 18_446_744_073_709_551_616.0;
        if r >= 1.0 {
            1.0 - f64::EPSILON / 2.0
        } else {
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_thousandth_output_of_default_seed() {
        // The C++ standard ([rand.predef]) requires this value.
        let mut rng = Mt19937::new(5489);
        let mut last = 0;
        for _ in 0..10_000 {
            last = rng.next_u32();
        }
        assert_eq!(last, 4_123_659_995);
    }

    #[test]
    fn reseed_restarts_the_sequence() {
        let mut a = Mt19937::new(7);
        let first: Vec<u32> = (0..700).map(|_| a.next_u32()).collect();
        a.reseed(7);
        let again: Vec<u32> = (0..700).map(|_| a.next_u32()).collect();
        assert_eq!(first, again);
    }

    #[test]
    fn canonical_double_combines_two_outputs() {
        let mut a = Mt19937::new(99);
        let mut b = Mt19937::new(99);
        for _ in 0..1000 {
            let lo = f64::from(b.next_u32());
            let hi = f64::from(b.next_u32());
            let x = a.next_f64();
            assert!((0.0..1.0).contains(&x));
            assert_eq!(
                x,
                (lo + hi * 4_294_967_296.0) / 18_446_744_073_709_551_616.0
            );
        }
    }
}
