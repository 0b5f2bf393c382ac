// The `log_processor` section of a run: mmengine's LogProcessor, which decides
// the numbers `lockstep train` logs to the console and to metrics.jsonl (and
// TensorBoard). Its keys are mmengine's:
//
//   log_processor:
//     type: LogProcessor          # the default; Detectron2LogProcessor logs as detectron2
//     window_size: 10             # loss, time, data_time, grad_norm: mean of the last 10 entries
//     mean_pattern: '.*(loss|time|data_time|grad_norm).*'
//     custom_cfg:                 # more statistics, under names of their own
//       - {data_src: loss, log_name: loss_max, method_name: max, window_size: global}
//     by_epoch: true              # read for mmengine's configs; shapes only mmengine's own line
//     num_digits: 4               # likewise
//
// Without the section, mmengine's defaults: the mean of 10 of rank 0's values.
// `type: Detectron2LogProcessor` (with `window_size`, default 20) logs the
// mean over ranks and the median of the window, as detectron2's writers.
//
//   TrainerOptions options;
//   options.log_processor(parse_log_processor(config.child("log_processor")));
#pragma once

#include "lockstep/config/config.h"
#include "lockstep/events/log_processor.h"

namespace lockstep {

// A null section gives mmengine's defaults; bad keys fail naming file and line.
LogProcessor parse_log_processor(const Config& section);

}  // namespace lockstep
