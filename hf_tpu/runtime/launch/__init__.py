"""How a jitted computation is launched: now (Strict), blocking (Debug) or recorded into a trace
(DeferAndFuse), and the device PRNG's key material each launch takes."""
