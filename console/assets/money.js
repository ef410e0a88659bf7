// Credits are decimal strings (nano-credit precision). Sums are exact in BigInt
// nano-credits; floats are used only to size chart shapes.

const SCALE = 1_000_000_000n;

/** "12.5" → 12500000000n. */
export function toNanos(amount) {
  const text = String(amount);
  const negative = text.startsWith('-');
  const [whole, fraction = ''] = text.replace('-', '').split('.');
  const nanos = BigInt(whole || '0') * SCALE + BigInt((fraction + '000000000').slice(0, 9));
  return negative ? -nanos : nanos;
}

/** 12500000000n → "12.5" (no trailing zeros), as the API writes decimals. */
export function fromNanos(nanos) {
  const negative = nanos < 0n;
  const magnitude = negative ? -nanos : nanos;
  const whole = magnitude / SCALE;
  const fraction = (magnitude % SCALE).toString().padStart(9, '0').replace(/0+$/, '');
  return `${negative ? '-' : ''}${whole}${fraction ? `.${fraction}` : ''}`;
}

/** The exact sum of decimal strings. */
export function sum(amounts) {
  return fromNanos(amounts.reduce((total, amount) => total + toNanos(amount), 0n));
}

/** A decimal string for reading: the exact value with its unit. */
export function credits(amount) {
  return `${fromNanos(toNanos(amount))} cr`;
}

/** A float for geometry only. */
export function approximate(amount) {
  return Number(toNanos(amount)) / 1e9;
}
