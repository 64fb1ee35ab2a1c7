// DeferAndFuse recording without entering Python.
//
// Every lowered op's PrivateUse1 kernel is a `RecordingKernel`: a boxed C++ kernel in front of the
// Python one (dispatch.OpKernel). Under DeferAndFuse, a functional op whose arguments are whole
// contiguous tpu tensors, numbers and static values is looked up by (op, argument metadata, values);
// on a hit the kernel creates the output tensor from the cached result metadata and appends
// (op, arguments, output) to a native trace, with no Python at all. On a miss it runs the Python
// kernel, which teaches the cache (`teach`) when the op qualifies. The native trace is handed to Python
// (`replay_records`) before Python next needs a payload (a read of an output it has not seen, a write,
// a flush), and Python records each entry into its own trace from the cached executable: the program
// it builds is the same as when every op went through Python.
//
// Outputs get fake data pointers from their own range (from 2^52), so Python can tell a pointer it has
// not been handed yet without asking.

#include <torch/extension.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DefaultDtype.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/library.h>

#include <atomic>
#include <optional>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "device_tensor.h"

namespace py = pybind11;

namespace hf_tpu_native {

struct RecordingKernel;

namespace {

constexpr c10::DeviceType kDevice = c10::DeviceType::PrivateUse1;
constexpr uint64_t kFirstPtr = 1ULL << 52;
constexpr uint64_t kAlign = 64;

// Where a tensor argument sits: argument `position`, or element `element` of the tensor list there.
struct TensorSlot {
  uint32_t position;
  int32_t element;  // -1: the argument is the tensor itself
};

// Where each input of a cached executable comes from, in order: tensor `index`'s storage payload
// ('t'), tensor `index`'s storage offset ('o', a traced offset), or the number at argument `index`
// ('n', a traced number: its value is not part of the cache key, or is too large to bake in).
struct LeafSource {
  char kind;
  uint32_t index;
};

// What a cache hit needs to make the output and what Python needs to record it. It owns references to
// its Python objects, released with it (a kernel's cache is emptied when full; records hold theirs).
struct Output {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;  // PyTorch's layout of the output (a permutation of row-major)
  at::ScalarType dtype = at::kFloat;
  int64_t nbytes = 0;
  PyObject* shape = nullptr;  // the shape as a tuple (the registry's payload shape)
  PyObject* dtype_obj = nullptr;
};

struct CachedOp {
  PyObject* entry = nullptr;  // the Python kernel's cache entry (its jitted fn, spec, output avals)
  PyObject* fn = nullptr;     // the entry's jitted executable
  std::vector<Output> outputs;
  // per tensor argument: the shape of its storage's payload the entry reads it from (a tuple), and the
  // tensor's own metadata
  std::vector<PyObject*> input_shapes;
  std::vector<std::vector<int64_t>> input_sizes;
  std::vector<std::vector<int64_t>> input_strides;
  std::vector<int64_t> input_offsets;
  std::vector<at::ScalarType> input_dtypes;
  std::vector<LeafSource> leaves;  // the cached executable's inputs

  CachedOp() = default;
  CachedOp(const CachedOp&) = delete;
  CachedOp& operator=(const CachedOp&) = delete;
  ~CachedOp() {  // the Python objects it owns (the last holder may be a thread without the GIL)
    if (!Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    Py_XDECREF(entry);
    Py_XDECREF(fn);
    for (PyObject* shape : input_shapes) Py_XDECREF(shape);
    for (const Output& o : outputs) {
      Py_XDECREF(o.shape);
      Py_XDECREF(o.dtype_obj);
    }
  }
};

// argument metadata seen (a moving offset makes one per step); a full cache starts again empty, so a long
// process (a test suite, a decode loop over growing lengths) keeps recording its current shapes
constexpr size_t kMaxEntriesPerOp = 512;

struct Record {
  RecordingKernel* kernel;
  c10::OperatorHandle op;
  std::shared_ptr<const CachedOp> cached;
  // the arguments, tensors taken out: a tensor's metadata may change after the op (`t.data = u`,
  // `set_`), so what the op read is its storage as it was (`inputs`), seen through the cached metadata
  std::vector<c10::IValue> args;
  std::vector<TensorSlot> slots;
  std::vector<c10::Storage> inputs;
  std::vector<uint64_t> out_ptrs;
  std::vector<void*> out_weaks;
};

std::mutex trace_mutex;
std::vector<Record> trace;
std::atomic<size_t> pending{0};    // records in the native trace
std::atomic<size_t> in_flight{0};  // records taken by a hand-over that has not finished replaying them
std::atomic<bool> recording{false};
std::atomic<bool> strict{false};           // Strict mode: cached ops run from C++ (`run_strict`)
std::atomic<bool> several_threads{false};  // more than one thread uses tpu tensors (threads.py)
std::atomic<bool> multi_chip{false};  // arrays may be sharded: every op takes its Python kernel
// storages whose value a failed DeferAndFuse flush never computed: an op reading one takes its Python
// kernel, which raises at once naming the op and the lost input (as without the recorder)
std::mutex failed_mutex;
std::unordered_set<uint64_t> failed_storages;
std::atomic<bool> any_failed{false};

bool reads_a_failed_value(const std::vector<at::Tensor>& tensors) {
  if (!any_failed.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(failed_mutex);
  for (const at::Tensor& t : tensors)
    if (failed_storages.count(reinterpret_cast<uintptr_t>(t.storage().data_ptr().get()))) return true;
  return false;
}
std::atomic<uint64_t> next_ptr{kFirstPtr};
std::atomic<size_t> max_pending{2048};
std::atomic<uint64_t> n_hits{0}, n_misses{0}, n_taught{0}, n_python{0};
std::atomic<uint64_t> n_adopted{0}, n_dropped{0};
std::atomic<uint64_t> n_strict{0};  // Strict ops run from C++
// What the Strict fast path needs from Python (set once by `install_strict`, kept for the process): the
// registry's `adopt_recorded` and payload dict, `platform.last_launched`, the LazyValue type,
// DONATION_LOCK, and Dynamo's `set_eval_frame`.
struct StrictHooks {
  PyObject* adopt = nullptr;
  PyObject* payloads = nullptr;
  PyObject* last_launched = nullptr;
  PyObject* lazy_value_type = nullptr;
  PyObject* donation_lock = nullptr;
  PyObject* set_eval_frame = nullptr;
  PyObject* memory_fraction = nullptr;  // memory._fraction: below 1, every new buffer is checked in Python
} strict_hooks;  // hand-over outputs given a payload / dead before one
PyObject* drain_callback = nullptr;  // Python: hands the native trace over (kept for the process)

struct TeachSlot {
  RecordingKernel* kernel = nullptr;
  const c10::OperatorHandle* op = nullptr;
  const std::string* key = nullptr;
  bool traced_numbers = false;  // the key leaves out the values of numbers (RecordingKernel::numbers_traced)
  const std::vector<at::Tensor>* tensors = nullptr;
  size_t op_returns = 0;  // tensors the op returns (each a fresh output when it can be recorded), or 0
                          // when a return is not a Tensor (a list of tensors, a number)
};

size_t tensor_returns(const c10::OperatorHandle& op) {
  for (const auto& r : op.schema().returns())
    if (r.type()->kind() != c10::TypeKind::TensorType) return 0;
  return op.schema().returns().size();
}
thread_local TeachSlot teach_slot;
thread_local bool thread_seen = false;  // this thread has run a tpu op through Python (threads.py)

template <typename T>
void put(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

template <typename List>
bool put_list(std::string& key, char tag, const List& list) {
  key.push_back(tag);
  put(key, static_cast<int32_t>(list.size()));
  for (auto x : list) put(key, static_cast<typename List::value_type>(x));
  return true;
}

bool is_number_argument(const c10::Argument& arg) {
  const auto& t = arg.real_type();
  if (t->kind() == c10::TypeKind::NumberType) return true;
  auto optional = t->cast<c10::OptionalType>();
  return optional && optional->getElementType()->kind() == c10::TypeKind::NumberType;
}

bool is_tensor_argument(const c10::Argument& arg) {
  const auto& t = arg.real_type();
  if (t->kind() == c10::TypeKind::TensorType) return true;
  auto optional = t->cast<c10::OptionalType>();
  return optional && optional->getElementType()->kind() == c10::TypeKind::TensorType;
}

bool is_tensor_list_argument(const c10::Argument& arg) {
  const auto& t = arg.real_type();
  auto list = t->cast<c10::ListType>();
  return list && list->getElementType()->kind() == c10::TypeKind::TensorType;
}

// A tpu tensor argument into the cache key: its dtype, sizes, strides and offset.
bool encode_tensor(const at::Tensor& t, std::string& key) {
  if (t.device().type() != kDevice || t.layout() != at::kStrided || !t.has_storage() || t.is_neg() ||
      t.is_conj() || t.unsafeGetTensorImpl()->is_wrapped_number())
    return false;
  key.push_back('t');
  put(key, static_cast<int8_t>(t.scalar_type()));
  put(key, static_cast<int32_t>(t.dim()));
  for (int64_t s : t.sizes()) put(key, s);
  for (int64_t s : t.strides()) put(key, s);
  put(key, t.storage_offset());
  return true;
}

// One argument into the cache key; false when the op cannot be recorded natively with it. With
// `traced_numbers`, a float or int number (a Scalar, or a wrapped number in a Tensor argument) enters
// the key by its type only, as it does the Python kernel's once that kernel traces its numbers.
bool encode(const c10::IValue& v, const c10::Argument& arg, bool traced_numbers, std::string& key,
            std::vector<at::Tensor>& tensors, std::vector<TensorSlot>& slots, uint32_t position) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {
      key.push_back('u');
      return true;
    }
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) {  // `x * 0.5`: a number
      if (t.dim() != 0 || !t.device().is_cpu()) return false;
      const bool traced = traced_numbers && (t.scalar_type() == at::kDouble || t.scalar_type() == at::kLong);
      key.push_back(traced ? 'W' : 'w');
      put(key, static_cast<int8_t>(t.scalar_type()));
      if (traced) return true;
      switch (t.scalar_type()) {
        case at::kDouble:
          put(key, *t.const_data_ptr<double>());
          return true;
        case at::kLong:
          put(key, *t.const_data_ptr<int64_t>());
          return true;
        case at::kBool:
          put(key, *t.const_data_ptr<bool>());
          return true;
        default:
          return false;
      }
    }
    if (!encode_tensor(t, key)) return false;
    tensors.push_back(t);
    slots.push_back(TensorSlot{position, -1});
    return true;
  }
  if (v.isNone()) {
    key.push_back('n');
    return true;
  }
  if (v.isDouble()) {
    if (traced_numbers && is_number_argument(arg)) {
      key.push_back('x');
      return true;
    }
    key.push_back('d');
    put(key, v.toDouble());
    return true;
  }
  if (v.isInt()) {
    if (traced_numbers && is_number_argument(arg)) {
      key.push_back('y');
      return true;
    }
    key.push_back('i');
    put(key, v.toInt());
    return true;
  }
  if (v.isBool()) {
    key.push_back('b');
    put(key, v.toBool());
    return true;
  }
  if (v.isTensorList()) {  // cat, stack: each element as a tensor argument
    auto list = v.toTensorList();
    key.push_back('L');
    put(key, static_cast<int32_t>(list.size()));
    for (size_t e = 0; e < list.size(); ++e) {
      at::Tensor t = list.get(e);
      if (!t.defined() || !encode_tensor(t, key)) return false;
      tensors.push_back(std::move(t));
      slots.push_back(TensorSlot{position, static_cast<int32_t>(e)});
    }
    return true;
  }
  if (v.isIntList()) return put_list(key, 'I', v.toIntList());
  if (v.isDoubleList()) return put_list(key, 'F', v.toDoubleList());
  if (v.isBoolList()) return put_list(key, 'B', v.toBoolList());
  if (v.isString()) {
    key.push_back('s');
    const std::string& s = v.toStringRef();
    put(key, static_cast<int32_t>(s.size()));
    key.append(s);
    return true;
  }
  if (v.isDevice()) {
    key.push_back('D');
    auto d = v.toDevice();
    put(key, static_cast<int8_t>(d.type()));
    put(key, static_cast<int8_t>(d.index()));
    return true;
  }
  return false;  // optional-tensor lists, generators, ...: the Python kernel
}

// A traced number's value as the Python kernel's leaf (a Python float or int).
py::object number_leaf(const c10::IValue& v) {
  if (v.isDouble()) return py::float_(v.toDouble());
  if (v.isInt()) return py::int_(v.toInt());
  const at::Tensor& t = v.toTensor();  // a wrapped number
  if (t.scalar_type() == at::kDouble) return py::float_(*t.const_data_ptr<double>());
  return py::int_(*t.const_data_ptr<int64_t>());
}

// An argument as the Python kernel receives it (what torch gives a kernel registered from Python:
// dtypes, layouts and memory formats as their Python objects, wrapped numbers as Python numbers).
py::object to_python(const c10::Argument& arg, const c10::IValue& value) {
  if (value.isNone()) return py::none();
  auto kind_is = [&](c10::TypeKind kind) {
    const auto& t = arg.real_type();
    if (t->kind() == kind) return true;
    if (auto optional = t->cast<c10::OptionalType>()) return optional->getElementType()->kind() == kind;
    return false;
  };
  if (kind_is(c10::ScalarTypeType::Kind)) {
    return py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<c10::ScalarType>(value.toInt()))));
  }
  if (kind_is(c10::LayoutType::Kind)) {
    return py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<c10::Layout>(value.toInt()))));
  }
  if (kind_is(c10::MemoryFormatType::Kind)) {
    return py::reinterpret_borrow<py::object>(
        torch::utils::getTHPMemoryFormat(static_cast<c10::MemoryFormat>(value.toInt())));
  }
  return torch::jit::toPyObject(value);
}

std::pair<py::tuple, py::dict> python_arguments(const c10::OperatorHandle& op,
                                                const std::vector<c10::IValue>& values) {
  const auto& schema_args = op.schema().arguments();
  size_t positional = 0;
  while (positional < values.size() && !schema_args[positional].kwarg_only()) ++positional;
  py::tuple args(positional);
  for (size_t i = 0; i < positional; ++i) args[i] = to_python(schema_args[i], values[i]);
  py::dict kwargs;
  for (size_t i = positional; i < values.size(); ++i)
    kwargs[py::str(schema_args[i].name())] = to_python(schema_args[i], values[i]);
  return {std::move(args), std::move(kwargs)};
}

void push_python_result(const c10::OperatorHandle& op, torch::jit::Stack* stack, py::handle out) {
  const auto& returns = op.schema().returns();
  if (returns.empty()) return;
  if (returns.size() == 1) {
    stack->push_back(torch::jit::toIValue(out, returns[0].real_type()));
    return;
  }
  auto outs = py::reinterpret_borrow<py::sequence>(out);
  TORCH_CHECK(outs.size() == returns.size(), "hf_tpu: ", op.schema().name(), " returned ", outs.size(),
              " values, its schema says ", returns.size());
  for (size_t i = 0; i < returns.size(); ++i)
    stack->push_back(torch::jit::toIValue(outs[i], returns[i].real_type()));
}

// The tensor input `i` of a cached op was, over `storage`.
at::Tensor tensor_on(c10::Storage storage, const CachedOp& cached, size_t i) {
  return device_tensor(std::move(storage), cached.input_dtypes[i], cached.input_sizes[i], cached.input_strides[i],
                       cached.input_offsets[i]);
}

// The arguments of a record with its tensors put back (over the storages it read), as the op had them.
void restore_tensors(std::vector<c10::IValue>& args, const std::vector<TensorSlot>& slots,
                     const std::vector<c10::Storage>& inputs, const CachedOp& cached) {
  for (size_t i = 0; i < slots.size();) {
    const uint32_t position = slots[i].position;
    if (slots[i].element < 0) {
      args[position] = tensor_on(inputs[i], cached, i);
      ++i;
      continue;
    }
    c10::List<at::Tensor> list;
    for (; i < slots.size() && slots[i].position == position; ++i) list.push_back(tensor_on(inputs[i], cached, i));
    args[position] = std::move(list);
  }
}

// A new reference to the payload array of storage `ptr` (in `payloads`, the registry) when tensor input `i`
// of `cached` reads it as taught: computed (not None, nor of type `reject`), of the taught payload shape and
// dtype; else nullptr. What a Strict call and a hand-over both check before passing it to the executable.
PyObject* taught_payload_array(PyObject* payloads, uint64_t ptr, const CachedOp& cached, size_t i, PyObject* reject) {
  PyObject* key = PyLong_FromUnsignedLongLong(ptr);
  PyObject* payload = PyDict_GetItem(payloads, key);  // borrowed
  Py_DECREF(key);
  if (payload == nullptr) return nullptr;
  PyObject* array = PyObject_GetAttrString(payload, "array");
  if (array == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  bool plain = array != Py_None && reinterpret_cast<PyObject*>(Py_TYPE(array)) != reject;
  if (plain) {
    PyObject* dtype = PyObject_GetAttrString(payload, "dtype");
    PyObject* shape = PyObject_GetAttrString(payload, "shape");
    plain = dtype == reinterpret_cast<PyObject*>(torch::getTHPDtype(cached.input_dtypes[i])) && shape != nullptr &&
            PyObject_RichCompareBool(shape, cached.input_shapes[i], Py_EQ) == 1;
    Py_XDECREF(dtype);
    Py_XDECREF(shape);
    PyErr_Clear();
  }
  if (!plain) {
    Py_DECREF(array);
    return nullptr;
  }
  return array;
}

void call_drain_callback() {
  py::gil_scoped_acquire gil;
  if (drain_callback == nullptr) return;
  PyObject* result = PyObject_CallNoArgs(drain_callback);
  if (result == nullptr) throw python_error();
  Py_DECREF(result);
}

}  // namespace

struct RecordingKernel final : public c10::OperatorKernel {
  RecordingKernel(PyObject* kernel, bool teachable) : py_kernel(kernel), teachable(teachable) {
    Py_INCREF(kernel);  // never released: the registration lives as long as the process
  }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    const bool deferred = recording.load(std::memory_order_relaxed);
    if (teachable && !multi_chip.load(std::memory_order_relaxed) &&
        (deferred || strict.load(std::memory_order_relaxed))) {
      std::string key;
      key.reserve(96);
      key.push_back(deferred ? 'R' : 'S');  // each mode's entries are the Python kernel's for that mode
      std::vector<at::Tensor> tensors;
      std::vector<TensorSlot> slots;
      auto first = stack->end() - static_cast<std::ptrdiff_t>(n);
      const auto& schema_args = op.schema().arguments();
      const bool traced = numbers_traced.load(std::memory_order_relaxed);
      bool recordable = true;
      for (size_t i = 0; i < n && recordable; ++i)
        recordable = encode(first[i], schema_args[i], traced, key, tensors, slots, static_cast<uint32_t>(i));
      if (recordable) {
        put(key, static_cast<int8_t>(c10::get_default_dtype_as_scalartype()));
        std::shared_ptr<const CachedOp> hit;
        {
          std::lock_guard<std::mutex> lock(mutex);
          auto it = cache.find(key);
          if (it != cache.end()) hit = it->second;
        }
        if (hit && reads_a_failed_value(tensors)) hit = nullptr;
        if (hit && thread_seen) {
          if (deferred) {
            record(op, stack, n, std::move(hit), std::move(slots));
            return;
          }
          if (run_strict(op, stack, n, *hit, tensors)) return;
          call_python(op, stack, n, nullptr, nullptr, false);  // an input it cannot read plainly, an error
          return;
        }
        if (hit) {  // a thread's first: through Python, which notes the thread as one using tpu tensors
          thread_seen = true;
          call_python(op, stack, n, nullptr, nullptr, false);
          return;
        }
        n_misses.fetch_add(1, std::memory_order_relaxed);
        call_python(op, stack, n, &key, &tensors, traced);
        return;
      }
    }
    call_python(op, stack, n, nullptr, nullptr, false);
  }

  void record(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t n,
              std::shared_ptr<const CachedOp> cached, std::vector<TensorSlot> slots) {
    std::vector<c10::IValue> args = torch::jit::pop(*stack, n);
    std::vector<c10::Storage> inputs;
    inputs.reserve(slots.size());
    for (const TensorSlot& slot : slots) {
      const c10::IValue& arg = args[slot.position];
      inputs.push_back(slot.element < 0 ? arg.toTensor().storage() : arg.toTensorList().get(slot.element).storage());
    }
    for (const TensorSlot& slot : slots) args[slot.position] = c10::IValue();
    std::vector<uint64_t> ptrs;
    std::vector<void*> weaks;
    for (const Output& o : cached->outputs) {
      const uint64_t nbytes = static_cast<uint64_t>(o.nbytes);
      const uint64_t ptr = next_ptr.fetch_add((nbytes + kAlign) / kAlign * kAlign);
      c10::Storage storage = fake_storage(ptr, o.nbytes);
      weaks.push_back(weak_reference(storage));
      ptrs.push_back(ptr);
      stack->emplace_back(device_tensor(std::move(storage), o.dtype, o.sizes, o.strides));
    }
    size_t count;
    {
      std::lock_guard<std::mutex> lock(trace_mutex);
      trace.push_back(Record{this, op, std::move(cached), std::move(args), std::move(slots), std::move(inputs),
                             std::move(ptrs), std::move(weaks)});
      count = trace.size();
      pending.store(count, std::memory_order_release);
    }
    n_hits.fetch_add(1, std::memory_order_relaxed);
    if (count >= max_pending.load(std::memory_order_relaxed)) call_drain_callback();
  }

  // Strict: run the cached executable on the inputs' payload arrays and make the outputs, all from C++
  // (Python runs only inside the jitted call and to give the outputs their payloads). False, with the
  // stack untouched, when an input is not its storage's computed array as taught, or the call fails:
  // the Python kernel then runs the op (and raises its error, naming the op).
  bool run_strict(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t n, const CachedOp& cached,
                  const std::vector<at::Tensor>& tensors) {
    py::gil_scoped_acquire gil;
    const StrictHooks& h = strict_hooks;
    if (h.adopt == nullptr || PyFloat_AsDouble(PyList_GET_ITEM(h.memory_fraction, 0)) != 1.0) {
      PyErr_Clear();
      return false;
    }
    auto first = stack->end() - static_cast<std::ptrdiff_t>(n);
    py::tuple leaves(cached.leaves.size());
    {
      const bool locked = several_threads.load(std::memory_order_relaxed);  // as threads.array_of
      if (locked && !call_method(h.donation_lock, "acquire")) return false;
      bool plain = true;
      for (size_t l = 0; l < cached.leaves.size() && plain; ++l) {
        const LeafSource& source = cached.leaves[l];
        const size_t i = source.index;
        if (source.kind == 'o') {
          leaves[l] = py::int_(cached.input_offsets[i]);
        } else if (source.kind == 'n') {
          leaves[l] = number_leaf(first[i]);
        } else {
          PyObject* array = taught_payload_array(
              h.payloads, reinterpret_cast<uintptr_t>(tensors[i].storage().data_ptr().get()), cached, i,
              h.lazy_value_type);
          if (array == nullptr) plain = false;
          else leaves[l] = py::reinterpret_steal<py::object>(array);
        }
      }
      if (locked && !call_method(h.donation_lock, "release")) plain = false;
      if (!plain) return false;
    }
    // outside Dynamo's frame hook until the outputs are registered, as OpKernel.__call__
    PyObject* prior = PyObject_CallOneArg(h.set_eval_frame, Py_None);
    if (prior == nullptr) {
      PyErr_Clear();
      return false;
    }
    struct RestoreFrame {
      PyObject* set_eval_frame;
      PyObject* prior;
      ~RestoreFrame() {
        PyObject *type, *exc, *tb;  // an error in flight survives the call
        PyErr_Fetch(&type, &exc, &tb);
        PyObject* back = PyObject_CallOneArg(set_eval_frame, prior);
        Py_XDECREF(back);
        PyErr_Clear();
        PyErr_Restore(type, exc, tb);
        Py_DECREF(prior);
      }
    } restore_frame{h.set_eval_frame, prior};
    PyObject* result = PyObject_Call(cached.fn, leaves.ptr(), nullptr);
    if (result == nullptr) {
      // the Python kernel runs the op again and raises its own error (naming the op); an interrupt
      // (KeyboardInterrupt, SystemExit) is the user's, not the op's
      if (!PyErr_ExceptionMatches(PyExc_Exception)) throw python_error();
      PyErr_Clear();
      return false;
    }
    py::object value = py::reinterpret_steal<py::object>(result);
    const size_t n_out = cached.outputs.size();
    if (n_out > 1 && (!PySequence_Check(result) || PySequence_Size(result) != static_cast<Py_ssize_t>(n_out))) {
      PyErr_Clear();
      return false;
    }
    if (PyList_SetItem(h.last_launched, 0, value.inc_ref().ptr()) != 0) {
      PyErr_Clear();
      return false;
    }
    torch::jit::drop(*stack, n);
    for (size_t o = 0; o < n_out; ++o) {
      const Output& out = cached.outputs[o];
      py::object array = n_out == 1 ? value : py::reinterpret_steal<py::object>(PySequence_GetItem(result, o));
      const uint64_t ptr = next_ptr.fetch_add((static_cast<uint64_t>(out.nbytes) + kAlign) / kAlign * kAlign);
      c10::Storage storage = fake_storage(ptr, out.nbytes);
      void* weak = weak_reference(storage);
      stack->emplace_back(device_tensor(std::move(storage), out.dtype, out.sizes, out.strides));
      PyObject* done = PyObject_CallFunction(h.adopt, "KKOOLO", static_cast<unsigned long long>(ptr),
                                             static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(weak)),
                                             out.shape, out.dtype_obj, static_cast<long long>(out.nbytes), array.ptr());
      if (done == nullptr) {
        c10::raw::weak_intrusive_ptr::decref(static_cast<c10::StorageImpl*>(weak));  // not the registry's
        throw python_error();
      }
      Py_DECREF(done);
    }
    n_strict.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  static bool call_method(PyObject* obj, const char* name) {
    PyObject* r = PyObject_CallMethod(obj, name, nullptr);
    if (r == nullptr) {
      PyErr_Clear();
      return false;
    }
    Py_DECREF(r);
    return true;
  }

  void call_python(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t n, const std::string* key,
                   const std::vector<at::Tensor>* tensors, bool traced) {
    std::vector<c10::IValue> values = torch::jit::pop(*stack, n);
    py::gil_scoped_acquire gil;
    n_python.fetch_add(1, std::memory_order_relaxed);
    thread_seen = true;
    auto [args, kwargs] = python_arguments(op, values);
    TeachSlot saved = teach_slot;
    teach_slot = key == nullptr ? TeachSlot{} : TeachSlot{this, &op, key, traced, tensors, tensor_returns(op)};
    PyObject* out = PyObject_Call(py_kernel, args.ptr(), kwargs.ptr());
    teach_slot = saved;
    if (out == nullptr) throw python_error();
    py::object result = py::reinterpret_steal<py::object>(out);
    push_python_result(op, stack, result);
  }

  PyObject* py_kernel;
  bool teachable;
  // the Python kernel traces its numbers (it has seen many values): keys leave their values out
  std::atomic<bool> numbers_traced{false};
  std::mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<const CachedOp>> cache;
};

namespace {

torch::Library& library() {
  static torch::Library* lib =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  return *lib;
}

// `name`: "add.Tensor" (the overload in the aten namespace); `kernel`: the Python kernel it fronts.
void register_kernel(const std::string& name, py::handle kernel, bool teachable) {
  auto functor = std::make_unique<RecordingKernel>(kernel.ptr(), teachable);
  library().impl(name.c_str(), torch::CppFunction::makeFromBoxedKernel(
                                   c10::BoxedKernel::makeFromFunctor(std::move(functor))));
}

// View kernels compute metadata only: PyTorch's CPU kernels serve tpu tensors (views alias storage).
void cpu_metadata_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

void register_metadata_kernel(const std::string& name) {
  library().impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&cpu_metadata_kernel>());
}

// Called by the Python kernel of the op the current RecordingKernel is running, once it knows the op
// can be recorded natively: `entry` is its cache entry, `spec` its outputs (`native_out_spec`). The tensors
// among `fargs` (the arguments it ran on, in schema order) must be the ones the cache key describes, else
// nothing is cached; `views` and `leaves` say how each was read (a View of its storage's payload, whose
// `base_shape` is that payload's shape, or None: the payload itself) and which numbers are traced (a
// number argument that is itself a leaf). `traced_numbers`: the Python kernel traces every float and int
// number from now on, so the cache key may leave their values out.
bool teach(py::handle kernel, py::handle entry, py::tuple spec, py::sequence fargs, py::sequence views,
           py::sequence leaves, bool traced_numbers) {
  TeachSlot& slot = teach_slot;
  if (slot.kernel == nullptr || slot.key == nullptr || slot.kernel->py_kernel != kernel.ptr()) return false;
  if (slot.op_returns == 0 || spec.size() != slot.op_returns) return false;
  if (traced_numbers != slot.traced_numbers) {
    if (traced_numbers && !slot.kernel->numbers_traced.exchange(true)) {
      // its entries keyed by value would never be found again
      std::lock_guard<std::mutex> lock(slot.kernel->mutex);
      slot.kernel->cache.clear();
    }
    return false;  // this key was made the other way; the next call's is taught
  }
  {
    std::lock_guard<std::mutex> lock(slot.kernel->mutex);
    if (slot.kernel->cache.count(*slot.key)) return false;
  }
  const auto& tensors = *slot.tensors;
  const auto& schema_args = slot.op->schema().arguments();
  if (views.size() != tensors.size() || fargs.size() != schema_args.size()) return false;
  py::str base_shape_name("base_shape"), shape_name("shape"), offset_name("offset");
  std::vector<py::object> payload_shapes;
  std::vector<LeafSource> plan;
  const size_t n_leaves = leaves.size();
  size_t k = 0;  // tensors seen
  size_t j = 0;  // leaves accounted for
  auto take_tensor = [&](PyObject* obj) {
    if (k == tensors.size() || j == n_leaves) return false;
    const at::Tensor& seen = THPVariable_Unpack(obj);
    const at::Tensor& t = tensors[k];
    if (seen.sizes() != t.sizes() || seen.strides() != t.strides() || seen.storage_offset() != t.storage_offset() ||
        seen.scalar_type() != t.scalar_type())
      return false;
    py::object view = views[k];
    // read without a view: the kernel was handed the storage's whole payload, or a value it computed
    // (zeros for a storage never written, a reinterpretation) in the tensor's own shape. Only a whole
    // contiguous tensor can later be read as its storage's payload, so only that one is taught.
    if (view.is_none() && (!t.is_contiguous() || t.storage_offset() != 0)) return false;
    const bool traced_offset = !view.is_none() && view.attr(offset_name).is_none();
    if (!view.is_none() && !traced_offset && !PyLong_Check(view.attr(offset_name).ptr())) return false;  // N-D
    py::object base = view.is_none() ? py::object(leaves[j].attr(shape_name)) : py::object(view.attr(base_shape_name));
    payload_shapes.push_back(py::tuple(base));
    plan.push_back(LeafSource{'t', static_cast<uint32_t>(k)});
    ++j;
    if (traced_offset) {
      if (j == n_leaves) return false;
      plan.push_back(LeafSource{'o', static_cast<uint32_t>(k)});
      ++j;
    }
    ++k;
    return true;
  };
  for (size_t i = 0; i < schema_args.size(); ++i) {
    py::object arg = fargs[i];
    PyObject* obj = arg.ptr();
    if (THPVariable_Check(obj)) {
      if (!take_tensor(obj)) return false;
    } else if (is_tensor_list_argument(schema_args[i]) && (PyList_Check(obj) || PyTuple_Check(obj))) {
      for (auto element : py::reinterpret_borrow<py::sequence>(arg))
        if (!THPVariable_Check(element.ptr()) || !take_tensor(element.ptr())) return false;
    } else if ((PyFloat_CheckExact(obj) || PyLong_CheckExact(obj)) && j < n_leaves && leaves[j].ptr() == obj &&
               (is_number_argument(schema_args[i]) || is_tensor_argument(schema_args[i]))) {
      // a Scalar or a wrapped number (the Python kernel's NUMBER and TENSOR kinds): the only numbers it
      // ever passes as executable inputs
      plan.push_back(LeafSource{'n', static_cast<uint32_t>(i)});  // a number the executable takes as input
      ++j;
    }
  }
  if (k != tensors.size() || j != n_leaves) return false;
  std::vector<Output> outputs;
  std::vector<py::object> owned;  // the outputs' shape and dtype objects, kept by the entry once it is cached
  for (auto one : spec) {
    // (payload shape, dtype, sizes, strides): the output's storage holds a row-major array of the payload
    // shape, which the tensor sees with PyTorch's sizes and strides
    if (!PyTuple_Check(one.ptr()) || PyTuple_GET_SIZE(one.ptr()) != 4) return false;
    py::tuple four = py::reinterpret_borrow<py::tuple>(one);
    if (!THPDtype_Check(four[1].ptr())) return false;
    Output o;
    o.dtype = reinterpret_cast<THPDtype*>(four[1].ptr())->scalar_type;
    int64_t numel = 1;
    for (auto d : py::reinterpret_borrow<py::tuple>(four[0])) numel *= d.cast<int64_t>();
    for (auto d : py::reinterpret_borrow<py::tuple>(four[2])) o.sizes.push_back(d.cast<int64_t>());
    for (auto d : py::reinterpret_borrow<py::tuple>(four[3])) o.strides.push_back(d.cast<int64_t>());
    if (o.sizes.size() != o.strides.size()) return false;
    o.nbytes = numel * static_cast<int64_t>(c10::elementSize(o.dtype));
    owned.emplace_back(four[0]);
    o.shape = owned.back().ptr();
    owned.emplace_back(four[1]);
    o.dtype_obj = owned.back().ptr();
    outputs.push_back(std::move(o));
  }
  for (auto& object : owned) object.release();  // from here on the entry is cached: it owns them
  auto cached = std::make_shared<CachedOp>();
  cached->outputs = std::move(outputs);
  cached->entry = entry.inc_ref().ptr();
  cached->fn = py::object(entry.attr("fn")).release().ptr();
  cached->leaves = std::move(plan);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    cached->input_shapes.push_back(payload_shapes[i].release().ptr());
    cached->input_sizes.push_back(t.sizes().vec());
    cached->input_strides.push_back(t.strides().vec());
    cached->input_offsets.push_back(t.storage_offset());
    cached->input_dtypes.push_back(t.scalar_type());
  }
  {
    std::lock_guard<std::mutex> lock(slot.kernel->mutex);
    if (slot.kernel->cache.size() >= kMaxEntriesPerOp) slot.kernel->cache.clear();
    slot.kernel->cache.emplace(*slot.key, std::move(cached));
  }
  slot.key = nullptr;
  n_taught.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// An output a hand-over has computed, kept for the records after it that read it: it is given its payload
// (`adopt`) only once none of them is left, and only if its storage is still alive then. Most outputs
// live only inside one trace (`y = y + x` in a loop) and never need one.
struct Produced {
  py::object value;  // the LazyValue (or array) Python recorded for it
  const Output* output = nullptr;
  void* weak = nullptr;
  size_t readers = 0;  // records of this hand-over not yet replayed that read it
};

class Handover {
 public:
  explicit Handover(py::handle adopt) : adopt_(adopt) {}
  ~Handover() {
    for (auto& [ptr, p] : produced_) release(p.weak);  // only after an error escaped the loop
  }

  // Before the replay: how many records read each output of the batch.
  void count_readers(const std::vector<Record>& records) {
    for (const Record& rec : records) {
      for (size_t o = 0; o < rec.out_ptrs.size(); ++o) readers_[rec.out_ptrs[o]] = 0;
      for (const c10::Storage& input : rec.inputs) {
        auto it = readers_.find(ptr_of(input));
        if (it != readers_.end()) ++it->second;
      }
    }
  }

  // The value of a batch output a record reads (nullptr: not one of this hand-over's).
  const Produced* find(const c10::Storage& input) const {
    auto it = produced_.find(ptr_of(input));
    return it == produced_.end() ? nullptr : &it->second;
  }

  // Record `rec` computed `value` (one output's, or a sequence of one per output).
  void computed(const Record& rec, const CachedOp& cached, const py::object& value) {
    const size_t n = cached.outputs.size();
    py::sequence many;
    if (n > 1) many = py::reinterpret_borrow<py::sequence>(value);
    for (size_t o = 0; o < n; ++o) {
      Produced p{n == 1 ? value : py::object(many[o]), &cached.outputs[o], rec.out_weaks[o], 0};
      auto it = readers_.find(rec.out_ptrs[o]);
      p.readers = it == readers_.end() ? 0 : it->second;
      if (p.readers == 0)
        settle(rec.out_ptrs[o], p);
      else
        produced_.emplace(rec.out_ptrs[o], std::move(p));
    }
  }

  // Record `rec` is replayed and holds its inputs no more: outputs it was the last reader of are settled.
  void read_by(const std::vector<uint64_t>& input_ptrs) {
    for (uint64_t ptr : input_ptrs) {
      auto it = produced_.find(ptr);
      if (it == produced_.end() || --it->second.readers > 0) continue;
      Produced p = std::move(it->second);
      produced_.erase(it);
      settle(ptr, p);
    }
  }

  // Every kept output gets its payload now (a Python kernel is about to look the payloads up).
  void settle_all() {
    auto all = std::move(produced_);
    produced_.clear();
    for (auto& [ptr, p] : all) settle(ptr, p);
  }

  static uint64_t ptr_of(const c10::Storage& s) { return reinterpret_cast<uintptr_t>(s.data_ptr().get()); }

  // The first error a payload's registration raised, if any (taken once).
  std::optional<py::error_already_set> take_error() {
    std::optional<py::error_already_set> e;
    e.swap(error_);
    return e;
  }

 private:
  void settle(uint64_t ptr, Produced& p) {
    if (c10::raw::weak_intrusive_ptr::use_count(static_cast<c10::StorageImpl*>(p.weak)) == 0) {
      release(p.weak);  // dead: no tensor can ever read it
      n_dropped.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    n_adopted.fetch_add(1, std::memory_order_relaxed);
    const Output& out = *p.output;
    try {
      adopt_(py::int_(ptr), py::int_(reinterpret_cast<uintptr_t>(p.weak)), py::handle(out.shape),
             py::handle(out.dtype_obj), py::int_(out.nbytes), p.value);
    } catch (py::error_already_set& e) {  // the rest are still settled; the first error is raised after
      release(p.weak);
      if (!error_) error_.emplace(std::move(e));
    }
  }

  static void release(void* weak) { c10::raw::weak_intrusive_ptr::decref(static_cast<c10::StorageImpl*>(weak)); }

  py::handle adopt_;
  std::optional<py::error_already_set> error_;
  std::unordered_map<uint64_t, size_t> readers_;
  std::unordered_map<uint64_t, Produced> produced_;
};

// Empties the native trace into Python's, in order: per record, `fast(entry, leaves, outs)` when every
// tensor argument reads its value as the entry was built for (the output of an earlier record of this
// batch, or its storage's payload: `payloads` is the registry), `leaves` being the cached executable's
// inputs, returning the recorded value(s); else `general(kernel, entry, args, kwargs, outs)` runs the
// Python kernel, which gives its outputs their payloads itself. `outs`: per output, (fake pointer, weak
// storage reference, bytes, shape, dtype). `adopt(ptr, weak, shape, dtype, nbytes, value)` gives an
// output that is still alive its payload (see `Handover`). `plain_reads` false sends every record the
// second way. Returns how many records were handed over.
size_t replay_records(py::handle fast, py::handle general, py::handle adopt, const py::dict& payloads,
                      bool plain_reads) {
  std::vector<Record> records;
  {
    std::lock_guard<std::mutex> lock(trace_mutex);
    records.swap(trace);
    in_flight.fetch_add(records.size());
    pending.store(0, std::memory_order_release);
  }
  // what replaying runs is not the Python kernel of a cache miss: nothing it computes may be taught
  TeachSlot saved = teach_slot;
  teach_slot = TeachSlot{};
  struct Restore {
    TeachSlot& slot;
    TeachSlot saved;
    size_t count;
    ~Restore() {
      slot = saved;
      in_flight.fetch_sub(count);
    }
  } restore{teach_slot, saved, records.size()};
  Handover handover(adopt);
  handover.count_readers(records);
  std::optional<py::error_already_set> first_error;
  std::vector<uint64_t> input_ptrs;
  for (Record& rec : records) {
    const CachedOp& cached = *rec.cached;
    input_ptrs.clear();
    for (const c10::Storage& input : rec.inputs) input_ptrs.push_back(Handover::ptr_of(input));
   try {
    py::object leaves;
    if (plain_reads) {
      py::tuple arrays(cached.leaves.size());
      bool plain = true;
      for (size_t l = 0; l < cached.leaves.size() && plain; ++l) {
        const LeafSource& source = cached.leaves[l];
        const size_t i = source.index;
        if (source.kind == 'o') {
          arrays[l] = py::int_(cached.input_offsets[i]);
          continue;
        }
        if (source.kind == 'n') {
          arrays[l] = number_leaf(rec.args[i]);
          continue;
        }
        if (const Produced* p = handover.find(rec.inputs[i])) {
          plain = p->output->dtype == cached.input_dtypes[i];
          if (plain) {
            int same = PyObject_RichCompareBool(p->output->shape, cached.input_shapes[i], Py_EQ);
            if (same < 0) throw python_error();
            plain = same == 1;
          }
          if (plain) arrays[l] = p->value;
          continue;
        }
        PyObject* array = taught_payload_array(payloads.ptr(), input_ptrs[i], cached, i, nullptr);
        plain = array != nullptr;
        if (plain) arrays[l] = py::reinterpret_steal<py::object>(array);
      }
      if (plain) leaves = std::move(arrays);
    }
    py::tuple outs(cached.outputs.size());
    for (size_t o = 0; o < cached.outputs.size(); ++o) {
      const Output& out = cached.outputs[o];
      outs[o] = py::make_tuple(py::int_(rec.out_ptrs[o]), py::int_(reinterpret_cast<uintptr_t>(rec.out_weaks[o])),
                               py::int_(out.nbytes), py::handle(out.shape), py::handle(out.dtype_obj));
    }
    if (leaves) {
      handover.computed(rec, cached, fast(py::handle(cached.entry), leaves, outs));
    } else {
      handover.settle_all();  // the Python kernel reads its inputs from their payloads
      restore_tensors(rec.args, rec.slots, rec.inputs, cached);
      auto [args, kwargs] = python_arguments(rec.op, rec.args);
      general(py::handle(rec.kernel->py_kernel), py::handle(cached.entry), args, kwargs, outs);
    }
   } catch (py::error_already_set& e) {  // the others are still handed over; the first error is raised
    if (!first_error) first_error.emplace(std::move(e));
   }
    // its inputs are no longer held here: at a flush inside a later record, values only this trace
    // still referenced are not live outputs (as when the op was recorded in Python)
    std::vector<c10::IValue>().swap(rec.args);
    std::vector<c10::Storage>().swap(rec.inputs);
    handover.read_by(input_ptrs);
  }
  handover.settle_all();
  if (auto e = handover.take_error(); e && !first_error) first_error.emplace(std::move(*e));
  if (first_error) throw std::move(*first_error);
  return records.size();
}

py::dict recording_stats() {
  py::dict d;
  d["hits"] = n_hits.load();
  d["misses"] = n_misses.load();
  d["taught"] = n_taught.load();
  d["python_calls"] = n_python.load();
  d["pending"] = pending.load();
  d["adopted"] = n_adopted.load();
  d["strict"] = n_strict.load();
  d["dropped"] = n_dropped.load();
  return d;
}

}  // namespace

void init_recorder(py::module& m) {
  m.def("register_kernel", &register_kernel, py::arg("name"), py::arg("kernel"), py::arg("teachable"),
        "Register a recording PrivateUse1 kernel for aten overload `name` in front of Python kernel `kernel`");
  m.def("set_recording", [](bool on) { recording.store(on); }, "Record cached ops natively (DeferAndFuse)");
  m.def("recording", []() { return recording.load(); });
  m.def("set_strict", [](bool on) { strict.store(on); }, "Run cached ops from C++ (Strict mode)");
  m.def(
      "note_failed_storages",
      [](const std::vector<uint64_t>& ptrs) {
        std::lock_guard<std::mutex> lock(failed_mutex);
        failed_storages.insert(ptrs.begin(), ptrs.end());
        any_failed.store(!failed_storages.empty());
      },
      "Storages (fake pointers) holding values a failed flush never computed");
  m.def("set_multi_chip", [](bool on) { multi_chip.store(on); },
        "Arrays may be sharded over several chips: leave every op to its Python kernel");
  m.def("note_several_threads", []() { several_threads.store(true); },
        "More than one thread uses tpu tensors: payloads are read under DONATION_LOCK");
  m.def(
      "install_strict",
      [](py::object adopt, py::dict payloads, py::list last_launched, py::object lazy_value_type,
         py::object donation_lock, py::object set_eval_frame, py::list memory_fraction) {
        strict_hooks = StrictHooks{adopt.release().ptr(),          payloads.release().ptr(),
                                   last_launched.release().ptr(),  lazy_value_type.release().ptr(),
                                   donation_lock.release().ptr(),  set_eval_frame.release().ptr(),
                                   memory_fraction.release().ptr()};
      },
      "What the Strict fast path calls: the registry's adopt_recorded and payloads, platform.last_launched, "
      "LazyValue, DONATION_LOCK, Dynamo's set_eval_frame, memory._fraction");
  m.def("set_drain_callback", [](py::object fn) { drain_callback = fn.release().ptr(); },
        "Python callable that takes the native trace over when it grows long");
  m.def("set_max_pending", [](int64_t n) { max_pending.store(n < 1 ? 1 : static_cast<size_t>(n)); },
        "Hand the native trace over once it holds `n` records (the room left before the graph-size limit)");
  m.def("pending", []() { return pending.load(std::memory_order_acquire) + in_flight.load(std::memory_order_acquire); },
        "Records not yet handed to Python, counting those a hand-over is replaying");
  m.def("teach", &teach, py::arg("kernel"), py::arg("entry"), py::arg("spec"), py::arg("fargs"),
        py::arg("views"), py::arg("leaves"), py::arg("traced_numbers"));
  m.def("register_metadata_kernel", &register_metadata_kernel, py::arg("name"),
        "Register PyTorch's CPU kernel (sizes, strides, offsets only) as the PrivateUse1 kernel of `name`");
  m.def("replay_records", &replay_records, py::arg("fast"), py::arg("general"), py::arg("adopt"),
        py::arg("payloads"), py::arg("plain_reads"));
  m.def("recording_stats", &recording_stats);
  m.attr("FIRST_RECORDED_PTR") = py::int_(kFirstPtr);
}

}  // namespace hf_tpu_native
