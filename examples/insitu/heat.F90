! In-situ training from a Fortran simulation: a 2D heat solver, its grid split
! over the ranks of MPI_COMM_WORLD by rows with halo exchange, trains a CNN
! surrogate of its own time step while it runs, through lockstep's Fortran
! module, under DDP over the same communicator.
!
!   python3 examples/insitu/make_surrogate.py work_dirs/insitu/surrogate.pt
!   mpirun -np 2 build/examples/insitu_heat_fortran examples/insitu/insitu.yaml work_dirs/insitu/surrogate.pt [WORK_DIR]
!   lockstep ckpt export work_dirs/insitu/model_final.ckpt --format torchscript -o work_dirs/insitu/trained.pt
!   python3 examples/insitu/check.py work_dirs/insitu/trained.pt
!
! The solver: u_t = alpha * laplacian(u) on a 64 x 64 grid, zero on the
! boundary, explicit steps with r = alpha * dt / dx^2 = 0.2; new heat arrives
! now and then as random Gaussian blobs. Each rank owns 64 / ranks rows plus
! one halo row on each side. Every other solver step, each rank hands
! lockstep its window (its rows and halos) as the input and the solver's step
! of that window as the target; lockstep averages the ranks' gradients.
! Every 50 training steps the ranks measure the surrogate on a held-out field
! (lockstep_predict) and rank 0 prints its error relative to "nothing
! changes"; the run fails unless it ends below 0.05.
program heat
  use, intrinsic :: iso_c_binding
  use mpi
  use lockstep
  implicit none

  integer, parameter :: nx = 64, ny = 64, train_steps = 400, evaluate_every = 50
  real(c_float), parameter :: r = 0.2
  real(c_float), parameter :: bound = 0.05
  integer :: ierr, rank, ranks, rows, first_row, status, step, trained, up, down
  character(len=1024) :: config, surrogate, work_dir
  character(len=1024), allocatable :: overrides(:)
  type(lockstep_trainer) :: trainer
  real(c_float), allocatable :: u(:, :), held_out(:, :)
  ! (x, window row, channel, batch): the tensor [batch, channel, row, x].
  real(c_float), allocatable, target :: window(:, :, :, :), next(:, :, :, :), predicted(:, :, :, :)
  real(c_double) :: loss, error

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, ranks, ierr)
  if (command_argument_count() < 2) then
    if (rank == 0) print '(a)', 'usage: heat CONFIG SURROGATE.pt [WORK_DIR]'
    call MPI_Abort(MPI_COMM_WORLD, 2, ierr)
  end if
  call get_command_argument(1, config)
  call get_command_argument(2, surrogate)
  if (mod(ny, ranks) /= 0) then
    if (rank == 0) print '(a,i0,a)', 'heat: ', ny, ' rows do not split evenly over the ranks'
    call MPI_Abort(MPI_COMM_WORLD, 2, ierr)
  end if
  rows = ny / ranks
  first_row = rank * rows
  up = merge(MPI_PROC_NULL, rank - 1, rank == 0)
  down = merge(MPI_PROC_NULL, rank + 1, rank == ranks - 1)

  ! The YAML's values can be overridden as `lockstep train --set` does.
  if (command_argument_count() >= 3) then
    call get_command_argument(3, work_dir)
    overrides = [character(len=1024) :: 'model.path=' // trim(surrogate), 'work_dir=' // trim(work_dir)]
  else
    overrides = [character(len=1024) :: 'model.path=' // trim(surrogate)]
  end if
  status = lockstep_create_mpi(trainer, config, MPI_COMM_WORLD, overrides)
  call check(status, 'lockstep_create_mpi')

  allocate(u(0:nx + 1, 0:rows + 1), held_out(0:nx + 1, 0:rows + 1))
  allocate(window(nx, rows + 2, 1, 1), next(nx, rows + 2, 1, 1), predicted(nx, rows + 2, 1, 1))
  u = 0
  call add_heat(u, 12345_c_int64_t)  ! every rank draws the same blobs; each keeps those on its rows
  call exchange(u)
  call held_out_field(held_out)
  call exchange(held_out)

  trained = 0
  step = 0
  do while (trained < train_steps)
    step = step + 1
    if (mod(step, 150) == 0) call add_heat(u, int(777 + step, c_int64_t))
    call solver_step(u)
    call exchange(u)
    if (mod(step, 2) /= 0) cycle
    window(:, :, 1, 1) = u(1:nx, 0:rows + 1)
    next(:, :, 1, 1) = stepped(u(0:nx + 1, 0:rows + 1))
    status = lockstep_train_step(trainer, lockstep_array(window), lockstep_array(next), loss)
    call check(status, 'lockstep_train_step')
    trained = trained + 1
    if (mod(trained, evaluate_every) == 0) then
      error = held_out_error()
      if (rank == 0) print '(a,i4,a,f8.5,a,es10.3)', 'heat: training step ', trained, &
        ': surrogate error on held-out states ', error, ', loss ', loss
      status = lockstep_log_scalar(trainer, 'held_out_error', error)
    end if
  end do

  error = held_out_error()
  status = lockstep_destroy(trainer)  ! the final checkpoint: model_final.ckpt in the work dir
  call check(status, 'lockstep_destroy')
  if (rank == 0) then
    if (error < bound) then
      print '(a,f8.5,a,f5.3)', 'heat: final surrogate error ', error, ' is below the bound ', bound
    else
      print '(a,f8.5,a,f5.3)', 'heat: final surrogate error ', error, ' is NOT below the bound ', bound
    end if
  end if
  call MPI_Finalize(ierr)
  if (error >= bound) error stop 1

contains

  subroutine check(status, what)
    integer, intent(in) :: status
    character(len=*), intent(in) :: what
    integer :: ierr
    if (status == LOCKSTEP_OK) return
    print '(a,i0,a,a,a,i0,a,a)', 'heat: rank ', rank, ': ', what, ' failed (status ', status, '): ', lockstep_error()
    call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
  end subroutine

  ! The explicit step on this rank's rows; zero outside the grid.
  subroutine solver_step(field)
    real(c_float), intent(inout) :: field(0:, 0:)
    field(1:nx, 1:rows) = stepped_rows(field)
  end subroutine

  function stepped_rows(field) result(out)
    real(c_float), intent(in) :: field(0:, 0:)
    real(c_float) :: out(nx, rows)
    out = field(1:nx, 1:rows) + r * (field(0:nx - 1, 1:rows) + field(2:nx + 1, 1:rows) + &
                                     field(1:nx, 0:rows - 1) + field(1:nx, 2:rows + 1) - 4 * field(1:nx, 1:rows))
  end function

  ! The solver's step of the window (rows and halos), zero beyond it.
  function stepped(field) result(out)
    real(c_float), intent(in) :: field(0:, 0:)
    real(c_float) :: out(nx, rows + 2)
    real(c_float) :: padded(0:nx + 1, 0:rows + 3)
    padded = 0
    padded(1:nx, 1:rows + 2) = field(1:nx, 0:rows + 1)
    out = padded(1:nx, 1:rows + 2) + r * (padded(0:nx - 1, 1:rows + 2) + padded(2:nx + 1, 1:rows + 2) + &
                                          padded(1:nx, 0:rows + 1) + padded(1:nx, 2:rows + 3) - &
                                          4 * padded(1:nx, 1:rows + 2))
  end function

  ! Halo rows from the neighbours (zero at the grid's top and bottom).
  subroutine exchange(field)
    real(c_float), intent(inout) :: field(0:, 0:)
    integer :: ierr
    real(c_float) :: sent(nx), received(nx)
    sent = field(1:nx, 1)
    received = 0
    call MPI_Sendrecv(sent, nx, MPI_REAL, up, 1, received, nx, MPI_REAL, down, 1, MPI_COMM_WORLD, &
                      MPI_STATUS_IGNORE, ierr)
    field(1:nx, rows + 1) = received
    sent = field(1:nx, rows)
    received = 0
    call MPI_Sendrecv(sent, nx, MPI_REAL, down, 2, received, nx, MPI_REAL, up, 2, MPI_COMM_WORLD, &
                      MPI_STATUS_IGNORE, ierr)
    field(1:nx, 0) = received
  end subroutine

  ! Three Gaussian blobs of heat at places drawn from `seed` (the same on every rank).
  subroutine add_heat(field, seed)
    real(c_float), intent(inout) :: field(0:, 0:)
    integer(c_int64_t), intent(in) :: seed
    integer :: i, j, blob
    integer(c_int64_t) :: state
    real(c_float) :: cx, cy, width, height
    state = seed
    do blob = 1, 3
      cx = next_uniform(state) * nx
      cy = next_uniform(state) * ny
      width = 3 + 6 * next_uniform(state)
      height = 0.5 + next_uniform(state)
      do j = 1, rows
        do i = 1, nx
          field(i, j) = field(i, j) + height * exp(-((i - cx)**2 + (first_row + j - cy)**2) / (2 * width**2))
        end do
      end do
    end do
  end subroutine

  ! A small linear congruential generator: the same numbers on every rank and compiler.
  function next_uniform(state) result(value)
    integer(c_int64_t), intent(inout) :: state
    real(c_float) :: value
    state = modulo(state * 1103515245_c_int64_t + 12345_c_int64_t, 2147483647_c_int64_t)
    value = real(modulo(state, 100000_c_int64_t), c_float) / 100000
  end function

  subroutine held_out_field(field)
    real(c_float), intent(out) :: field(0:, 0:)
    integer :: i, j
    field = 0
    do j = 1, rows
      do i = 1, nx
        field(i, j) = sin(3.1 * i / nx) * sin(2.3 * (first_row + j) / ny) + &
                      exp(-60 * ((real(i) / nx - 0.3)**2 + (real(first_row + j) / ny - 0.6)**2))
      end do
    end do
  end subroutine

  ! The surrogate's one-step error on the held-out field, relative to
  ! predicting no change, over every rank's window.
  function held_out_error() result(relative)
    real(c_double) :: relative
    real(c_double) :: local(2), total(2)
    integer :: status, ierr
    window(:, :, 1, 1) = held_out(1:nx, 0:rows + 1)
    next(:, :, 1, 1) = stepped(held_out)
    status = lockstep_predict(trainer, lockstep_array(window), lockstep_array(predicted))
    call check(status, 'lockstep_predict')
    local(1) = sum(real(predicted(:, 2:rows + 1, 1, 1) - next(:, 2:rows + 1, 1, 1), c_double)**2)
    local(2) = sum(real(window(:, 2:rows + 1, 1, 1) - next(:, 2:rows + 1, 1, 1), c_double)**2)
    call MPI_Allreduce(local, total, 2, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
    relative = total(1) / total(2)
  end function

end program heat
