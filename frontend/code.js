// Where the focused op was written: its creation stack in the Stack Trace pane and a frame's file
// in the Source Code pane, for one run and host (each selection's Focus makes one and closes it
// with itself, so the old selection's late answers are dropped).

import {frameMarks, sourceIndexOf} from './model.js';

export class CodePanes {
  /**
   * @param {object} api the api.js client of the run and host.
   * @param {{stack: object, source: object}} views the StackView and SourceView.
   */
  constructor(api, {stack, source}) {
    this.api = api;
    this.stack = stack;
    this.source = source;
    this.seq = 0;
    this.files = null;
    this.closed = false;
  }

  close() {
    this.closed = true;
  }

  /**
   * Shows a creation stack with its model-code and user-code frames marked (model.frameMarks)
   * and opens the model-code frame in the Source Code pane.
   * @param {string[]} ids stack frame ids, outermost first.
   * @param {object|null} known the summary's first bad tensor when the focus is it: its `source`
   *   and `user_source` name the frames.
   * @param {() => boolean} isCurrent whether the focus asked for is still the focus.
   */
  async showStack(ids, known, isCurrent) {
    if (!ids.length) {
      this.stack.show([], frameMarks([]));
      return;
    }
    let frames;
    try {
      frames = (await this.api.stackFrames(ids)).stack_frames;
    } catch (err) {
      if (!this.closed) this.stack.showError(err);
      return;
    }
    if (this.closed || !isCurrent()) return;
    const marks = frameMarks(frames, known);
    this.stack.show(frames, marks);
    if (marks.open >= 0) await this.openFrame(frames[marks.open]);
  }

  /** Opens a frame's file at its line; only the latest request is shown. */
  async openFrame(frame) {
    const seq = ++this.seq;
    const current = () => !this.closed && seq === this.seq;
    this.source.loading(frame.file_path);
    try {
      if (!this.files) this.files = (await this.api.sourceFiles()).items;
      if (!current()) return;
      const index = sourceIndexOf(this.files, frame);
      if (index < 0) {
        this.source.missing(frame);
        return;
      }
      const file = await this.api.sourceFile(index);
      if (current()) this.source.show(file, frame.lineno);
    } catch (err) {
      if (current()) this.source.showError(err);
    }
  }
}
