// The C++ half of the tpu device: what PyTorch only takes from a backend's C++ hooks.
//
// A backend written in Python can register availability hooks and a device guard that knows no events
// (torch._C._acc). PyTorch asks C++ hooks for three more things: a pinned host allocator
// (`pin_memory()`, `torch.empty(..., pin_memory=True)`, `DataLoader(pin_memory=True)`), device
// generators (`torch.Generator(device="tpu")`) and events (`torch.Event(device="tpu")`). This library
// registers those; the device's work itself stays in Python/JAX, reached through the callbacks object
// the Python side installs (`set_callbacks`). The hooks also resize tpu storages in place (FSDP2's
// `untyped_storage().resize_(n)`), again through a callback: the payloads live in Python.

#include <torch/extension.h>

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "device_tensor.h"

namespace py = pybind11;

namespace hf_tpu_native {

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;

// The Python object whose methods do the device work (hf_tpu/runtime/device/native_callbacks.py).
// Leaked on purpose: it must outlive every event destroyed during interpreter shutdown.
py::object* callbacks = nullptr;

py::object callback(const char* name) {
  TORCH_CHECK(callbacks != nullptr, "hf_tpu native: callbacks not installed (call set_callbacks first)");
  return callbacks->attr(name);
}

// -- generator ----------------------------------------------------------------------------------------
// Counter-based, like the device PRNG it drives: (seed, offset); every draw takes the next offsets.
constexpr uint64_t kDefaultSeed = 67280421310721ULL;
constexpr size_t kStateBytes = 16;  // little-endian seed then offset: torch.tpu.get_rng_state()'s format

struct TpuGeneratorImpl final : public c10::GeneratorImpl {
  explicit TpuGeneratorImpl(c10::DeviceIndex index = 0)
      : c10::GeneratorImpl(c10::Device(kTpu, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}

  void set_current_seed(uint64_t seed) override {
    std::lock_guard<std::mutex> lock(state_mutex_);
    seed_ = seed;
    offset_ = 0;
  }
  void set_offset(uint64_t offset) override {
    std::lock_guard<std::mutex> lock(state_mutex_);
    offset_ = offset;
  }
  uint64_t get_offset() const override {
    std::lock_guard<std::mutex> lock(state_mutex_);
    return offset_;
  }
  uint64_t current_seed() const override {
    std::lock_guard<std::mutex> lock(state_mutex_);
    return seed_;
  }
  uint64_t seed() override {
    uint64_t fresh = c10::detail::getNonDeterministicRandom();
    set_current_seed(fresh);
    return fresh;
  }

  // (seed, first offset) for `count` consecutive draws, reserved atomically.
  std::pair<uint64_t, uint64_t> draw(uint64_t count) {
    std::lock_guard<std::mutex> lock(state_mutex_);
    auto result = std::make_pair(seed_, offset_);
    offset_ += count;
    return result;
  }

  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    at::Tensor state = at::empty({static_cast<int64_t>(kStateBytes)}, at::TensorOptions().dtype(at::kByte));
    std::lock_guard<std::mutex> lock(state_mutex_);
    auto* out = state.data_ptr<uint8_t>();
    std::memcpy(out, &seed_, 8);
    std::memcpy(out + 8, &offset_, 8);
    return state.getIntrusivePtr();
  }

  void set_state(const c10::TensorImpl& new_state) override {
    TORCH_CHECK_TYPE(
        new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
        "tpu RNG state must be a torch.uint8 tensor (from torch.tpu.get_rng_state() or Generator.get_state()), got ",
        new_state.dtype());
    TORCH_CHECK(
        static_cast<size_t>(new_state.numel()) == kStateBytes,
        "tpu RNG state must be 16 bytes (from torch.tpu.get_rng_state()), got ", new_state.numel());
    TORCH_CHECK(new_state.device().is_cpu(), "tpu RNG state must be a CPU tensor, got one on ", new_state.device());
    const auto* data = static_cast<const uint8_t*>(new_state.data());
    std::lock_guard<std::mutex> lock(state_mutex_);
    std::memcpy(&seed_, data, 8);
    std::memcpy(&offset_, data + 8, 8);
  }

  static c10::DeviceType device_type() { return kTpu; }

 private:
  TpuGeneratorImpl* clone_impl() const override {
    auto* copy = new TpuGeneratorImpl(device().index());
    std::lock_guard<std::mutex> lock(state_mutex_);
    copy->seed_ = seed_;
    copy->offset_ = offset_;
    return copy;
  }

  mutable std::mutex state_mutex_;
  uint64_t seed_ = kDefaultSeed;
  uint64_t offset_ = 0;
};

// One logical device (DESIGN §3.3): every index names the same default generator.
const at::Generator& default_generator() {
  static at::Generator generator = at::make_generator<TpuGeneratorImpl>(0);
  return generator;
}

TpuGeneratorImpl* unwrap_generator(py::handle obj) {
  TORCH_CHECK_TYPE(THPGenerator_Check(obj.ptr()), "expected a torch.Generator, got ", py::str(obj.get_type()).cast<std::string>());
  at::Generator gen = THPGenerator_Unwrap(obj.ptr());
  TORCH_CHECK(gen.device().type() == kTpu, "expected a tpu generator, got one on ", gen.device());
  return gen.get<TpuGeneratorImpl>();
}

// -- pinned host memory -----------------------------------------------------------------------------
// Page-aligned host blocks the allocator remembers, so `is_pinned()` can answer. JAX stages transfers
// itself; what pinning promises here is PyTorch's contract (is_pinned, non-blocking copies), not DMA.
struct PinnedHostAllocator final : public c10::Allocator {
  static PinnedHostAllocator& instance() {
    static PinnedHostAllocator* allocator = new PinnedHostAllocator();  // outlives static destructors
    return *allocator;
  }

  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nullptr;
    if (nbytes > 0) {
      int rc = posix_memalign(&ptr, kAlignment, nbytes);
      TORCH_CHECK(rc == 0 && ptr != nullptr, "hf_tpu: could not allocate ", nbytes, " bytes of pinned host memory");
      std::lock_guard<std::mutex> lock(mutex_);
      blocks_[reinterpret_cast<uintptr_t>(ptr)] = nbytes;
      bytes_ += nbytes;
    }
    return {ptr, ptr, &release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

  bool contains(const void* ptr) const {
    if (ptr == nullptr) return false;
    auto addr = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.upper_bound(addr);
    if (it == blocks_.begin()) return false;
    --it;
    return addr < it->first + it->second;
  }

  size_t bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return bytes_;
  }

 private:
  static constexpr size_t kAlignment = 4096;

  static void release(void* ptr) {
    if (ptr == nullptr) return;
    auto& self = instance();
    {
      std::lock_guard<std::mutex> lock(self.mutex_);
      auto it = self.blocks_.find(reinterpret_cast<uintptr_t>(ptr));
      if (it != self.blocks_.end()) {
        self.bytes_ -= it->second;
        self.blocks_.erase(it);
      }
    }
    std::free(ptr);
  }

  mutable std::mutex mutex_;
  std::map<uintptr_t, size_t> blocks_;
  size_t bytes_ = 0;
};

// -- hooks --------------------------------------------------------------------------------------------
struct TpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override { return default_generator(); }
  at::Generator getNewGenerator(c10::DeviceIndex device_index = -1) const override {
    if (device_index > 0) {  // the Python side knows which indices name a device (platform.check_index)
      py::gil_scoped_acquire gil;
      callback("check_device_index")(device_index);
    }
    return at::make_generator<TpuGeneratorImpl>(device_index < 0 ? 0 : device_index);
  }
  at::Device getDeviceFromPtr(void*) const override { return at::Device(kTpu, 0); }
  bool isPinnedPtr(const void* data) const override { return PinnedHostAllocator::instance().contains(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &PinnedHostAllocator::instance(); }
  // `UntypedStorage.resize_(n)` (FSDP2 frees and reallocates unsharded parameters this way): the payload
  // lives in the Python registry, which resizes the storage in place (storages.resize_storage).
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    py::gil_scoped_acquire gil;
    py::object wrapped = py::reinterpret_steal<py::object>(THPStorage_Wrap(storage));
    if (!wrapped) throw py::error_already_set();
    callback("resize_storage")(wrapped, newsize);
  }
};

// -- device guard, streams and events ------------------------------------------------------------------
// One logical device with one in-order stream (JAX orders the work). An event is a Python
// `torch.tpu.Event` (device_module.py) held by reference: it knows which host copies to wait for.
struct TpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kTpu; }
  c10::Device exchangeDevice(c10::Device) const override { return getDevice(); }
  c10::Device getDevice() const override { return c10::Device(kTpu, 0); }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const noexcept override { return default_stream(); }
  c10::Stream getDefaultStream(c10::Device) const override { return default_stream(); }
  c10::Stream getStreamFromGlobalPool(c10::Device, bool = false) const override { return default_stream(); }
  c10::Stream getNewStream(c10::Device, int = 0) const override { return default_stream(); }
  c10::Stream exchangeStream(c10::Stream) const noexcept override { return default_stream(); }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }

  void record(void** event, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag flag) const override {
    py::gil_scoped_acquire gil;
    if (*event == nullptr) {
      py::object made = callback("new_event")(flag == c10::EventFlag::BACKEND_DEFAULT);
      *event = made.release().ptr();
    }
    py::handle(static_cast<PyObject*>(*event)).attr("record")();
  }

  void block(void*, const c10::Stream&) const override {}  // one in-order stream: already ordered

  bool queryEvent(void* event) const override {
    if (event == nullptr) return true;
    py::gil_scoped_acquire gil;
    return py::handle(static_cast<PyObject*>(event)).attr("query")().cast<bool>();
  }

  void synchronizeEvent(void* event) const override {
    if (event == nullptr) return;
    py::gil_scoped_acquire gil;
    py::handle(static_cast<PyObject*>(event)).attr("synchronize")();
  }

  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start != nullptr && end != nullptr, "both events must be recorded before elapsed_time()");
    py::gil_scoped_acquire gil;
    return py::handle(static_cast<PyObject*>(start))
        .attr("elapsed_time")(py::handle(static_cast<PyObject*>(end)))
        .cast<double>();
  }

  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    if (event == nullptr || !Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    Py_DECREF(static_cast<PyObject*>(event));
  }

  bool queryStream(const c10::Stream&) const override {
    synchronize();
    return true;
  }
  void synchronizeStream(const c10::Stream&) const override { synchronize(); }
  void synchronizeDevice(const c10::DeviceIndex) const override { synchronize(); }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}

 private:
  static c10::Stream default_stream() { return c10::Stream(c10::Stream::DEFAULT, c10::Device(kTpu, 0)); }
  static void synchronize() {
    py::gil_scoped_acquire gil;
    callback("synchronize")();
  }
};

// -- registration -----------------------------------------------------------------------------------
std::atomic<bool> registered{false};

// Register hooks and guard (once per process; PyTorch accepts PrivateUse1 hooks only once).
bool register_backend() {
  bool expected = false;
  if (!registered.compare_exchange_strong(expected, true)) return false;
  TORCH_CHECK(
      !at::isPrivateUse1HooksRegistered(),
      "hf_tpu native: PrivateUse1 hooks are already registered by another library");
  static TpuHooks* hooks = new TpuHooks();
  at::RegisterPrivateUse1HooksInterface(hooks);
  static TpuGuardImpl* guard = new TpuGuardImpl();
  c10::impl::registerDeviceGuard(kTpu, guard);
  return true;
}

void set_callbacks(py::object obj) {
  if (callbacks == nullptr) {
    callbacks = new py::object(std::move(obj));
  } else {
    *callbacks = std::move(obj);
  }
}

py::tuple draw(py::handle generator, uint64_t count) {
  auto [seed, offset] = unwrap_generator(generator)->draw(count);
  return py::make_tuple(seed, offset);
}

py::tuple draw_default(uint64_t count) {
  auto [seed, offset] = default_generator().get<TpuGeneratorImpl>()->draw(count);
  return py::make_tuple(seed, offset);
}

// A contiguous tpu tensor whose storage holds fake pointer `fake_ptr` (a key of the Python storage
// registry, never dereferenced) and a raw weak reference to that storage (what the registry keeps to
// see it die): what every op output needs, in one call instead of five Python-level ones.
py::tuple new_device_tensor(uint64_t fake_ptr, int64_t nbytes, c10::IntArrayRef shape, at::ScalarType dtype) {
  c10::Storage storage = fake_storage(fake_ptr, nbytes);
  void* weak = weak_reference(storage);
  at::Tensor tensor = device_tensor(std::move(storage), dtype, shape, c10::contiguous_strides(shape));
  return py::make_tuple(tensor, reinterpret_cast<uintptr_t>(weak));
}

// The arrays of a compiled graph's inputs, one C++ call for all of them: for each tpu tensor that reads
// its storage's whole payload (contiguous, offset 0, the payload's dtype and shape, no neg/conj bit) the
// payload's `array`, else None (the caller takes the general path: views, CPU tensors, Python numbers).
// `payloads` is the storage registry (fake data pointer -> Payload with `array`, `shape`, `dtype`).
py::list whole_payload_arrays(const py::sequence& args, const py::dict& payloads) {
  py::list out(args.size());
  py::str array_name("array"), shape_name("shape"), dtype_name("dtype");
  for (size_t i = 0; i < args.size(); ++i) {
    PyObject* obj = args[i].ptr();
    out[i] = py::none();
    if (!THPVariable_Check(obj)) continue;
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (t.device().type() != kTpu || t.storage_offset() != 0 || t.is_neg() || t.is_conj() ||
        !t.is_contiguous() || !t.has_storage())
      continue;
    py::int_ key(reinterpret_cast<uintptr_t>(t.storage().data_ptr().get()));
    PyObject* payload = PyDict_GetItem(payloads.ptr(), key.ptr());  // borrowed
    if (payload == nullptr) continue;
    py::handle p(payload);
    py::object dtype = p.attr(dtype_name);
    if (dtype.ptr() != reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()))) continue;
    py::object shape = p.attr(shape_name);
    if (!PyTuple_Check(shape.ptr())) continue;
    auto sizes = t.sizes();
    Py_ssize_t n = PyTuple_GET_SIZE(shape.ptr());
    if (n != static_cast<Py_ssize_t>(sizes.size())) continue;
    bool same = true;
    for (Py_ssize_t d = 0; d < n && same; ++d) {
      PyObject* size = PyTuple_GET_ITEM(shape.ptr(), d);
      same = PyLong_CheckExact(size) && PyLong_AsLongLong(size) == sizes[d];
    }
    if (!same) continue;
    out[i] = p.attr(array_name);
  }
  return out;
}

py::object default_generator_object() {
  return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(default_generator()));
}

void init_recorder(py::module& m);  // recorder.cpp

}  // namespace hf_tpu_native

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace hf_tpu_native;
  m.doc() = "hf_tpu's C++ hooks (pinned host allocator, tpu generators, events) and DeferAndFuse recorder";
  m.def("register_backend", &register_backend, "Register the PrivateUse1 hooks and device guard (once)");
  m.def("set_callbacks", &set_callbacks, "Install the Python object that does the device work");
  m.def("default_generator", &default_generator_object, "The tpu default generator (torch.Generator)");
  m.def("draw", &draw, py::arg("generator"), py::arg("count") = 1,
        "(seed, first offset) for `count` draws from a tpu generator, reserved atomically");
  m.def("draw_default", &draw_default, py::arg("count") = 1, "draw() from the default generator");
  m.def("new_device_tensor", &new_device_tensor, py::arg("fake_ptr"), py::arg("nbytes"), py::arg("shape"),
        py::arg("dtype"), "(tensor, weak storage reference) for a fresh contiguous tpu tensor");
  m.def("whole_payload_arrays", &whole_payload_arrays, py::arg("args"), py::arg("payloads"),
        "Per argument: its storage payload's array when a tpu tensor reads all of it, else None");
  m.def("pinned_bytes", []() { return PinnedHostAllocator::instance().bytes(); },
        "Bytes currently held by the pinned host allocator");
  init_recorder(m);
}
