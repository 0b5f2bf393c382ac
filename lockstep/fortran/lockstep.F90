! The `lockstep` Fortran module: lockstep's C API (lockstep/lockstep.h) for
! Fortran programs, through iso_c_binding. Link lockstep::fortran (CMake) or
! -llockstep_fortran -llockstep.
!
!   use lockstep
!   type(lockstep_trainer) :: trainer
!   real(c_float), allocatable, target :: x(:,:,:,:), y(:,:,:,:)   ! (nx, ny, channels, batch)
!   real(c_double) :: loss
!   integer :: status
!
!   status = lockstep_create(trainer, "surrogate.yaml")          ! or lockstep_create_mpi(trainer, path, MPI_COMM_WORLD)
!   if (status /= LOCKSTEP_OK) error stop lockstep_error()
!   status = lockstep_train_step(trainer, lockstep_array(x), lockstep_array(y), loss)
!   status = lockstep_predict(trainer, lockstep_array(x), lockstep_array(prediction))
!   status = lockstep_save_checkpoint(trainer, "step_000100")
!   status = lockstep_destroy(trainer)
!
! Arrays. A Fortran array is column-major: its first index varies fastest. So
! the same memory, read row-major as lockstep (and PyTorch) read it, has the
! dimensions in the reverse order: a Fortran array x(nx, ny, channels, batch)
! is the tensor [batch, channels, ny, nx] -- batch first, as a model wants.
! lockstep_array(x) records the shape reversed and points at x where it lies:
! nothing is copied. So declare arrays with the batch dimension LAST and the
! fastest-varying spatial dimension first. The array must be contiguous and
! have the TARGET attribute (or be allocatable/pointer with it), and must stay
! alive until the call that takes it returns. Supported kinds: real(c_float),
! real(c_double), integer(c_int32_t), integer(c_int64_t). An array of the kind
! the model computes in is read where it lies; otherwise it is converted in one
! copy: real(8) fields to the model's dtype (float32 mostly; values float32
! holds exactly train bitwise as real(4) would), integer(4) class indices to
! int64. lockstep_predict writes into a real(4) or real(8) output.
!
! Every function returns a status (LOCKSTEP_OK or an error kind);
! lockstep_error() returns the message of this thread's last error.
module lockstep
  use, intrinsic :: iso_c_binding
  implicit none
  private

  integer, parameter, public :: LOCKSTEP_OK = 0
  integer, parameter, public :: LOCKSTEP_ERR_ARGUMENT = 1
  integer, parameter, public :: LOCKSTEP_ERR_CONFIG = 2
  integer, parameter, public :: LOCKSTEP_ERR_IO = 3
  integer, parameter, public :: LOCKSTEP_ERR_DISTRIBUTED = 4
  integer, parameter, public :: LOCKSTEP_ERR_INTERNAL = 5

  integer(c_int), parameter :: DTYPE_FLOAT32 = 0, DTYPE_FLOAT64 = 1, DTYPE_INT32 = 2, DTYPE_INT64 = 3

  ! A trainer (an opaque handle; null until created, and after destroy).
  type, public :: lockstep_trainer
    type(c_ptr) :: handle = c_null_ptr
  end type

  ! A Fortran array as lockstep sees it: where it lies, its shape in C order
  ! (reversed), its element type. Made by lockstep_array(x).
  type, public :: lockstep_view
    type(c_ptr) :: data = c_null_ptr
    integer(c_int64_t), allocatable :: shape(:)
    integer(c_int) :: dtype = -1
  end type

  ! lockstep.h's lockstep_tensor.
  type, bind(c) :: c_tensor
    type(c_ptr) :: data
    integer(c_int32_t) :: ndim
    type(c_ptr) :: shape
    integer(c_int) :: dtype
    integer(c_int32_t) :: device
  end type

  public :: lockstep_array, lockstep_create, lockstep_create_with, lockstep_train_step, lockstep_predict, &
            lockstep_save_checkpoint, lockstep_load_checkpoint, lockstep_log_scalar, lockstep_iteration, &
            lockstep_rank, lockstep_destroy, lockstep_error
#ifdef LOCKSTEP_WITH_MPI
  public :: lockstep_create_mpi
#endif

  interface lockstep_array
    module procedure view_float32, view_float64, view_int32, view_int64
  end interface

  interface
    function c_create_with(path, overrides, count, out) bind(c, name="lockstep_trainer_create_with")
      import :: c_char, c_ptr, c_int32_t, c_int
      character(kind=c_char), dimension(*), intent(in) :: path
      type(c_ptr), value :: overrides
      integer(c_int32_t), value :: count
      type(c_ptr), intent(out) :: out
      integer(c_int) :: c_create_with
    end function
#ifdef LOCKSTEP_WITH_MPI
    function c_create_mpi(path, comm, overrides, count, out) bind(c, name="lockstep_trainer_create_mpi_fortran")
      import :: c_char, c_ptr, c_int32_t, c_int
      character(kind=c_char), dimension(*), intent(in) :: path
      integer(c_int), value :: comm
      type(c_ptr), value :: overrides
      integer(c_int32_t), value :: count
      type(c_ptr), intent(out) :: out
      integer(c_int) :: c_create_mpi
    end function
#endif
    function c_train_step(trainer, input, target, loss) bind(c, name="lockstep_train_step")
      import :: c_ptr, c_tensor, c_double, c_int
      type(c_ptr), value :: trainer
      type(c_tensor), intent(in) :: input, target
      real(c_double), intent(out) :: loss
      integer(c_int) :: c_train_step
    end function
    function c_predict(trainer, input, output) bind(c, name="lockstep_predict")
      import :: c_ptr, c_tensor, c_int
      type(c_ptr), value :: trainer
      type(c_tensor), intent(in) :: input
      type(c_tensor), intent(inout) :: output
      integer(c_int) :: c_predict
    end function
    function c_save(trainer, path) bind(c, name="lockstep_save_checkpoint")
      import :: c_ptr, c_char, c_int
      type(c_ptr), value :: trainer
      character(kind=c_char), dimension(*), intent(in) :: path
      integer(c_int) :: c_save
    end function
    function c_load(trainer, path, iteration) bind(c, name="lockstep_load_checkpoint")
      import :: c_ptr, c_char, c_int64_t, c_int
      type(c_ptr), value :: trainer
      character(kind=c_char), dimension(*), intent(in) :: path
      integer(c_int64_t), intent(out) :: iteration
      integer(c_int) :: c_load
    end function
    function c_log_scalar(trainer, name, value) bind(c, name="lockstep_log_scalar")
      import :: c_ptr, c_char, c_double, c_int
      type(c_ptr), value :: trainer
      character(kind=c_char), dimension(*), intent(in) :: name
      real(c_double), value :: value
      integer(c_int) :: c_log_scalar
    end function
    function c_iteration(trainer, iteration) bind(c, name="lockstep_trainer_iteration")
      import :: c_ptr, c_int64_t, c_int
      type(c_ptr), value :: trainer
      integer(c_int64_t), intent(out) :: iteration
      integer(c_int) :: c_iteration
    end function
    function c_rank(trainer, rank, world_size) bind(c, name="lockstep_trainer_rank")
      import :: c_ptr, c_int32_t, c_int
      type(c_ptr), value :: trainer
      integer(c_int32_t), intent(out) :: rank, world_size
      integer(c_int) :: c_rank
    end function
    function c_destroy(trainer) bind(c, name="lockstep_trainer_destroy")
      import :: c_ptr, c_int
      type(c_ptr), value :: trainer
      integer(c_int) :: c_destroy
    end function
    function c_last_error() bind(c, name="lockstep_last_error")
      import :: c_ptr
      type(c_ptr) :: c_last_error
    end function
    function c_strlen(text) bind(c, name="strlen")
      import :: c_ptr, c_size_t
      type(c_ptr), value :: text
      integer(c_size_t) :: c_strlen
    end function
  end interface

contains

  ! ---- arrays ---------------------------------------------------------------

  function view_float32(x) result(view)
    real(c_float), dimension(..), target, contiguous, intent(in) :: x
    type(lockstep_view) :: view
    call describe(view, shape(x, kind=c_int64_t), DTYPE_FLOAT32)
    view%data = c_loc(x)
  end function

  function view_float64(x) result(view)
    real(c_double), dimension(..), target, contiguous, intent(in) :: x
    type(lockstep_view) :: view
    call describe(view, shape(x, kind=c_int64_t), DTYPE_FLOAT64)
    view%data = c_loc(x)
  end function

  function view_int32(x) result(view)
    integer(c_int32_t), dimension(..), target, contiguous, intent(in) :: x
    type(lockstep_view) :: view
    call describe(view, shape(x, kind=c_int64_t), DTYPE_INT32)
    view%data = c_loc(x)
  end function

  function view_int64(x) result(view)
    integer(c_int64_t), dimension(..), target, contiguous, intent(in) :: x
    type(lockstep_view) :: view
    call describe(view, shape(x, kind=c_int64_t), DTYPE_INT64)
    view%data = c_loc(x)
  end function

  ! The shape in C order: the reverse of Fortran's.
  subroutine describe(view, fortran_shape, dtype)
    type(lockstep_view), intent(inout) :: view
    integer(c_int64_t), intent(in) :: fortran_shape(:)
    integer(c_int), intent(in) :: dtype
    integer :: d, n
    n = size(fortran_shape)
    allocate(view%shape(max(n, 1)))
    do d = 1, n
      view%shape(d) = fortran_shape(n - d + 1)
    end do
    view%dtype = dtype
  end subroutine

  function as_c(view) result(tensor)
    type(lockstep_view), target, intent(in) :: view
    type(c_tensor) :: tensor
    tensor%data = view%data
    tensor%ndim = 0
    tensor%shape = c_null_ptr
    if (allocated(view%shape)) then
      tensor%ndim = int(size(view%shape), c_int32_t)
      tensor%shape = c_loc(view%shape)
    end if
    tensor%dtype = view%dtype
    tensor%device = -1
  end function

  ! ---- strings --------------------------------------------------------------

  function c_string(text) result(terminated)
    character(len=*), intent(in) :: text
    character(kind=c_char, len=:), allocatable :: terminated
    terminated = trim(text) // c_null_char
  end function

  ! The message of this thread's last error ("" after a success).
  function lockstep_error() result(message)
    character(len=:), allocatable :: message
    type(c_ptr) :: text
    character(kind=c_char), pointer :: chars(:)
    integer :: i, n
    text = c_last_error()
    n = int(c_strlen(text))
    call c_f_pointer(text, chars, [n])
    allocate(character(len=n) :: message)
    do i = 1, n
      message(i:i) = chars(i)
    end do
  end function

  ! ---- the trainer ----------------------------------------------------------

  ! A trainer from a YAML config; `overrides` ("key=value", as `lockstep train
  ! --set`) are optional.
  function lockstep_create(trainer, config_path, overrides) result(status)
    type(lockstep_trainer), intent(out) :: trainer
    character(len=*), intent(in) :: config_path
    character(len=*), intent(in), optional :: overrides(:)
    integer :: status
    status = lockstep_create_with(trainer, config_path, overrides)
  end function

  function lockstep_create_with(trainer, config_path, overrides) result(status)
    type(lockstep_trainer), intent(out) :: trainer
    character(len=*), intent(in) :: config_path
    character(len=*), intent(in), optional :: overrides(:)
    integer :: status
    type(c_ptr), allocatable, target :: pointers(:)
    character(kind=c_char), allocatable, target :: texts(:, :)
    integer :: count
    call pack_overrides(overrides, texts, pointers, count)
    if (count > 0) then
      status = c_create_with(c_string(config_path), c_loc(pointers), int(count, c_int32_t), trainer%handle)
    else
      status = c_create_with(c_string(config_path), c_null_ptr, 0_c_int32_t, trainer%handle)
    end if
  end function

#ifdef LOCKSTEP_WITH_MPI
  ! A trainer over the ranks of an MPI communicator (a Fortran handle, such as
  ! MPI_COMM_WORLD from `use mpi`, or comm%MPI_VAL from `use mpi_f08`): no
  ! launcher or MASTER_ADDR needed.
  function lockstep_create_mpi(trainer, config_path, comm, overrides) result(status)
    type(lockstep_trainer), intent(out) :: trainer
    character(len=*), intent(in) :: config_path
    integer, intent(in) :: comm
    character(len=*), intent(in), optional :: overrides(:)
    integer :: status
    type(c_ptr), allocatable, target :: pointers(:)
    character(kind=c_char), allocatable, target :: texts(:, :)
    integer :: count
    call pack_overrides(overrides, texts, pointers, count)
    if (count > 0) then
      status = c_create_mpi(c_string(config_path), int(comm, c_int), c_loc(pointers), int(count, c_int32_t), &
                            trainer%handle)
    else
      status = c_create_mpi(c_string(config_path), int(comm, c_int), c_null_ptr, 0_c_int32_t, trainer%handle)
    end if
  end function
#endif

  ! Null-terminated copies of `overrides` (one per column of `texts`) and a C
  ! array of pointers to them.
  subroutine pack_overrides(overrides, texts, pointers, count)
    character(len=*), intent(in), optional :: overrides(:)
    character(kind=c_char), allocatable, target, intent(inout) :: texts(:, :)
    type(c_ptr), allocatable, target, intent(inout) :: pointers(:)
    integer, intent(out) :: count
    integer :: i, j, n
    count = 0
    if (.not. present(overrides)) return
    count = size(overrides)
    if (count == 0) return
    allocate(texts(len(overrides) + 1, count))
    allocate(pointers(count))
    do i = 1, count
      n = len_trim(overrides(i))
      do j = 1, n
        texts(j, i) = overrides(i)(j:j)
      end do
      texts(n + 1, i) = c_null_char
      pointers(i) = c_loc(texts(1, i))
    end do
  end subroutine

  ! One training iteration on (input, target); `loss` receives its loss.
  function lockstep_train_step(trainer, input, target, loss) result(status)
    type(lockstep_trainer), intent(in) :: trainer
    type(lockstep_view), target, intent(in) :: input, target
    real(c_double), intent(out), optional :: loss
    integer :: status
    real(c_double) :: value
    status = c_train_step(trainer%handle, as_c(input), as_c(target), value)
    if (present(loss)) loss = value
  end function

  ! The model's prediction for `input`, written into `output` (its shape and
  ! kind must be the prediction's, reversed as every lockstep_array is).
  function lockstep_predict(trainer, input, output) result(status)
    type(lockstep_trainer), intent(in) :: trainer
    type(lockstep_view), target, intent(in) :: input, output
    integer :: status
    type(c_tensor) :: out
    out = as_c(output)
    status = c_predict(trainer%handle, as_c(input), out)
  end function

  function lockstep_save_checkpoint(trainer, path) result(status)
    type(lockstep_trainer), intent(in) :: trainer
    character(len=*), intent(in) :: path
    integer :: status
    status = c_save(trainer%handle, c_string(path))
  end function

  ! Continues from a checkpoint; `iteration` receives the one it was written after.
  function lockstep_load_checkpoint(trainer, path, iteration) result(status)
    type(lockstep_trainer), intent(in) :: trainer
    character(len=*), intent(in) :: path
    integer(c_int64_t), intent(out), optional :: iteration
    integer :: status
    integer(c_int64_t) :: saved
    status = c_load(trainer%handle, c_string(path), saved)
    if (present(iteration)) iteration = saved
  end function

  function lockstep_log_scalar(trainer, name, value) result(status)
    type(lockstep_trainer), intent(in) :: trainer
    character(len=*), intent(in) :: name
    real(c_double), intent(in) :: value
    integer :: status
    status = c_log_scalar(trainer%handle, c_string(name), value)
  end function

  ! The iteration the next train_step runs.
  function lockstep_iteration(trainer, iteration) result(status)
    type(lockstep_trainer), intent(in) :: trainer
    integer(c_int64_t), intent(out) :: iteration
    integer :: status
    status = c_iteration(trainer%handle, iteration)
  end function

  ! This process's rank (from 0) and the number of ranks.
  function lockstep_rank(trainer, rank, world_size) result(status)
    type(lockstep_trainer), intent(in) :: trainer
    integer, intent(out) :: rank, world_size
    integer :: status
    integer(c_int32_t) :: r, w
    status = c_rank(trainer%handle, r, w)
    rank = int(r)
    world_size = int(w)
  end function

  ! Ends the run (the final checkpoint, the writers' last write); the trainer
  ! is null afterwards.
  function lockstep_destroy(trainer) result(status)
    type(lockstep_trainer), intent(inout) :: trainer
    integer :: status
    status = c_destroy(trainer%handle)
    trainer%handle = c_null_ptr
  end function

end module lockstep
