// Window maths of a virtualized list with a fixed row height. Pure: no DOM.
//
// Browsers cap an element's height (Chromium near 33.5M px), so a million 22px rows cannot be
// laid out at full height. Past `maxPx` the scrollable content is compressed: scrollTop maps
// linearly onto the virtual offset, and rows are drawn relative to the viewport, not the content.

export const DEFAULT_MAX_PX = 8000000;

/** Height of the scrollable spacer for `total` rows. */
export function contentHeight(total, rowHeight, maxPx = DEFAULT_MAX_PX) {
  return Math.min(Math.max(0, total) * rowHeight, maxPx);
}

/** Virtual (uncompressed) offset of the viewport's top edge for a given scrollTop. */
export function virtualTop(scrollTop, total, rowHeight, viewportHeight, maxPx = DEFAULT_MAX_PX) {
  const full = total * rowHeight;
  const content = contentHeight(total, rowHeight, maxPx);
  const fullRange = Math.max(0, full - viewportHeight);
  const scrollRange = Math.max(0, content - viewportHeight);
  const top = Math.min(Math.max(0, scrollTop), scrollRange);
  if (content === full || scrollRange === 0) return top;
  return (top / scrollRange) * fullRange;
}

/** The scrollTop that puts virtual offset `vTop` at the viewport's top edge. */
export function scrollTopForVirtual(vTop, total, rowHeight, viewportHeight, maxPx = DEFAULT_MAX_PX) {
  const full = total * rowHeight;
  const content = contentHeight(total, rowHeight, maxPx);
  const fullRange = Math.max(0, full - viewportHeight);
  const scrollRange = Math.max(0, content - viewportHeight);
  const v = Math.min(Math.max(0, vTop), fullRange);
  if (content === full || fullRange === 0) return v;
  return (v / fullRange) * scrollRange;
}

/**
 * Rows to draw for a viewport.
 * @returns {{first: number, end: number, offset: number}} rows [first, end), and the pixel
 *   position of row `first` relative to the viewport's top edge (<= 0).
 */
export function visibleRange({scrollTop, viewportHeight, rowHeight, total, overscan = 4,
  maxPx = DEFAULT_MAX_PX}) {
  if (total <= 0 || viewportHeight <= 0) return {first: 0, end: 0, offset: 0};
  const vTop = virtualTop(scrollTop, total, rowHeight, viewportHeight, maxPx);
  const firstVisible = Math.min(total - 1, Math.floor(vTop / rowHeight));
  const first = Math.max(0, firstVisible - overscan);
  const end = Math.min(total, Math.ceil((vTop + viewportHeight) / rowHeight) + overscan);
  return {first, end, offset: first * rowHeight - vTop};
}

/**
 * scrollTop that shows row `index`: centred (`'center'`), or moved the least distance that makes
 * it fully visible (`'nearest'`, for arrow keys).
 */
export function scrollTopForRow(index, {align = 'center', scrollTop = 0, viewportHeight, rowHeight,
  total, maxPx = DEFAULT_MAX_PX}) {
  const rowTop = index * rowHeight;
  let vTop;
  if (align === 'center') {
    vTop = rowTop - (viewportHeight - rowHeight) / 2;
  } else {
    const cur = virtualTop(scrollTop, total, rowHeight, viewportHeight, maxPx);
    if (rowTop < cur) vTop = rowTop;
    else if (rowTop + rowHeight > cur + viewportHeight) vTop = rowTop + rowHeight - viewportHeight;
    else return scrollTop;
  }
  return scrollTopForVirtual(vTop, total, rowHeight, viewportHeight, maxPx);
}

/** Clamps a keyboard-moved cursor into [0, total). */
export function clampIndex(index, total) {
  if (total <= 0) return -1;
  return Math.min(total - 1, Math.max(0, index));
}
